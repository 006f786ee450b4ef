#!/usr/bin/env python3
"""check_includes.py - the include rules between top-level folders (DESIGN.md
section 1, "Arrows between folders").

usage: check_includes.py SOURCE_ROOT

Reads every `#include "folder/..."` line of the C and CUDA sources of each
top-level folder, and each folder's meson.build references to another
folder's declared dependency (`<x>_dep = declare_dependency(...)`), and
fails, naming the file and line, on:

  * an arrow that ALLOWED below does not list (a new arrow between folders
    is a design change: add it to the table here and to DESIGN.md, keeping
    the table acyclic and in LAYERS order);
  * a "never" rule (NEVER_*), whatever ALLOWED says.

Includes without a folder ("kvserve_config.h", a file next to the includer)
and meson dependencies that no folder declares (cjson_dep, uv_dep...) are
not arrows. tests/ may include anything and is not checked. Exits 0 when
every arrow is allowed, 1 otherwise.
"""
import os
import re
import sys

# The folders from the bottom up: a folder may only use folders before it.
LAYERS = ["common", "kernels", "formats", "text", "model", "sampler", "grammar", "blockmgr",
          "scheduler",
          "config", "server", "cli", "loadtest"]

# The arrows the code has: folder -> the folders it includes or depends on.
# Each one points down LAYERS (checked below, so the table stays acyclic).
ALLOWED = {
    "common": set(),
    "kernels": {"common"},
    "formats": {"common"},
    "text": {"common", "formats"},
    "model": {"common", "kernels", "formats", "text"},
    "sampler": {"common"},
    "grammar": {"common"},
    "blockmgr": {"common"},
    "scheduler": {"common", "model", "sampler", "grammar", "blockmgr"},
    "config": {"common"},
    "server": {"common", "text", "model", "sampler", "grammar", "scheduler", "config"},
    "cli": {"common", "kernels", "formats", "text", "model", "sampler", "grammar", "blockmgr",
            "scheduler", "config", "server"},
    "loadtest": {"common"},
}

# Never, whatever ALLOWED says: (including folders, included folder).
NEVER_FOLDER = [
    ({"server"}, "kernels"),
    ({"scheduler", "blockmgr"}, "kernels"),
    ({"formats", "text"}, "model"),
]
# model/ internals the scheduler and the block manager never include.
MODEL_INTERNALS = {"model/model_int.h", "model/host_kv.h", "model/backend.h", "model/dev_fwd.h"}
NEVER_MODEL_INTERNALS = {"scheduler", "blockmgr"}
# Nothing includes cli/ (but cli/ itself).
# server/ internals: every server/ header but its public ones, included
# only by server/ itself, cli/ and tests/.
SERVER_PUBLIC = {"server/srv.h"}
SERVER_INTERNALS_OK = {"server", "cli"}

# Known violations of a never rule, each with its reason; the checker
# reports them as exceptions and does not fail on them. Entries are
# (file relative to the root, included path). Remove an entry when the code
# is fixed (an entry that no longer matches fails the test).
EXCEPTIONS = {
}

SRC_EXT = (".c", ".h", ".cu", ".cuh", ".inc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
DEP_DECL_RE = re.compile(r"^\s*(\w+_dep)\s*=\s*(declare_dependency\b|(\w+_dep)\s*$)")
DEP_REF_RE = re.compile(r"\b(\w+_dep)\b")


def walk(root, folder, want):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
        dirnames.sort()
        for f in sorted(filenames):
            if want(f):
                yield os.path.join(dirpath, f)


def strip_meson(line):
    """A meson.build line without its comment and its string literals."""
    out, q = [], None
    for ch in line:
        if q:
            if ch == q:
                q = None
            continue
        if ch in "'\"":
            q = ch
            continue
        if ch == "#":
            break
        out.append(ch)
    return "".join(out)


def dep_owners(root):
    """{dependency variable: folder that declares it} over every folder."""
    owners = {}
    for folder in LAYERS:
        for path in walk(root, folder, lambda f: f == "meson.build"):
            with open(path, encoding="utf-8") as fp:
                for line in fp:
                    m = DEP_DECL_RE.match(strip_meson(line))
                    if m:
                        owners[m.group(1)] = folder
    return owners


def arrows(root):
    """Yields (folder, file relative to root, line number, target folder, what)."""
    owners = dep_owners(root)
    for folder in LAYERS:
        for path in walk(root, folder, lambda f: f.endswith(SRC_EXT)):
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as fp:
                for n, line in enumerate(fp, 1):
                    m = INCLUDE_RE.match(line)
                    if m and "/" in m.group(1):
                        top = m.group(1).split("/", 1)[0]
                        if top in ALLOWED or top in ("cli", "tests"):
                            yield folder, rel, n, top, m.group(1)
        for path in walk(root, folder, lambda f: f == "meson.build"):
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as fp:
                for n, line in enumerate(fp, 1):
                    code = strip_meson(line)
                    if DEP_DECL_RE.match(code):
                        continue
                    for dep in DEP_REF_RE.findall(code):
                        if dep in owners:
                            yield folder, rel, n, owners[dep], dep


def check_table():
    errors = []
    for folder, targets in ALLOWED.items():
        for t in sorted(targets):
            if LAYERS.index(t) >= LAYERS.index(folder):
                errors.append(f"table: {folder} -> {t} does not point down the layers")
    return errors


def never(folder, target, what):
    """The never rule an arrow breaks, or None."""
    for froms, to in NEVER_FOLDER:
        if folder in froms and target == to:
            return f"{folder}/ never uses {to}/"
    if folder in NEVER_MODEL_INTERNALS and what in MODEL_INTERNALS:
        return f"{folder}/ never includes model/ internals"
    if target == "cli" and folder != "cli":
        return "nothing includes cli/"
    if (target == "server" and what.endswith(".h") and what not in SERVER_PUBLIC
            and folder not in SERVER_INTERNALS_OK):
        return "nothing but cli/ and tests/ includes server/ internals"
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    errors = check_table()
    used = set()
    n_arrows = 0
    for folder, rel, n, target, what in arrows(root):
        if target == folder:
            continue
        n_arrows += 1
        rule = never(folder, target, what)
        if rule:
            if (rel, what) in EXCEPTIONS:
                used.add((rel, what))
                print(f"{rel}:{n}: {what}: known exception ({rule}): {EXCEPTIONS[(rel, what)]}")
                continue
            errors.append(f"{rel}:{n}: {what}: forbidden: {rule}")
        elif target not in ALLOWED.get(folder, set()):
            errors.append(f"{rel}:{n}: {what}: forbidden arrow {folder}/ -> {target}/ "
                          "(not in the ALLOWED table of tests/arch/check_includes.py)")
    for key in sorted(set(EXCEPTIONS) - used):
        errors.append(f"{key[0]}: {key[1]}: exception no longer needed: remove it")
    for e in errors:
        print(e)
    print(f"check_includes: {n_arrows} arrows between folders, {len(errors)} forbidden")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
