#!/usr/bin/python3
"""make_seeds.py - writes the seed corpora of tests/fuzz/corpus/<target>/.

Run from anywhere: /usr/bin/python3 tests/fuzz/make_seeds.py
The seeds are committed; rerun after changing this script. Seeds are small
(libFuzzer mutates them; big seeds slow every execution).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def put(target, name, data):
    d = os.path.join(HERE, 'corpus', target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode('utf-8')
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def request_seeds():
    bodies = [
        {'model': 'austen-2.7m', 'prompt': 'Emma Woodhouse', 'max_tokens': 8},
        {'model': 'austen-2.7m', 'prompt': ['a', 'b'], 'n': 2, 'temperature': 0.7, 'top_p': 0.9,
         'top_k': 40, 'min_p': 0.05, 'seed': 42, 'stop': ['\n', 'END'], 'echo': True,
         'logprobs': 3, 'presence_penalty': 0.5, 'frequency_penalty': -0.5,
         'repetition_penalty': 1.1, 'logit_bias': {'10': -100, '11': 5}},
        {'model': 'austen-2.7m', 'prompt': [1, 2, 3, 4], 'stream': True,
         'stream_options': {'include_usage': True}, 'ignore_eos': True, 'min_tokens': 2,
         'stop_token_ids': [2], 'priority': 1, 'user': 'u'},
        {'model': 'austen-2.7m', 'prompt': [[1, 2], [3]], 'best_of': 1, 'suffix': ''},
        {'model': 'austen-2.7m', 'messages': [{'role': 'system', 'content': 'Be brief.'},
                                              {'role': 'user', 'content': 'Hello?'}],
         'max_completion_tokens': 16, 'logprobs': True, 'top_logprobs': 2,
         'response_format': {'type': 'text'}},
        {'model': 'austen-2.7m', 'messages': [
            {'role': 'user', 'content': [{'type': 'text', 'text': 'part one'},
                                         {'type': 'text', 'text': ' two'}]},
            {'role': 'assistant', 'content': None}], 'stream': True, 'n': 3,
         'max_tokens': 4, 'skip_special_tokens': False, 'add_generation_prompt': False},
        {'model': 'austen-2.7m', 'prompt': 'x', 'temperature': 3},
        {'model': 'austen-2.7m', 'prompt': 'x', 'max_tokens': 0},
        {'model': 'other', 'messages': []},
    ]
    for i, b in enumerate(bodies):
        put('request', 'body%02d.json' % i, json.dumps(b))
    put('request', 'nested.json', '{"prompt":' + '[' * 40 + ']' * 40 + '}')
    put('request', 'bad_utf8.json', b'{"prompt":"\xff\xfe"}')
    put('request', 'nul_escape.json', '{"prompt":"a\\u0000b"}')
    put('request', 'surrogate.json', '{"prompt":"\\ud83d\\ude00 \\ud800"}')
    put('request', 'not_object.json', '[1,2,3]')
    put('request', 'truncated.json', '{"model":"austen-2.7m","prompt":"abc')


def chat_seeds():
    tpls = [
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content | trim }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
        "{{ bos_token }}{% for m in messages %}{% if loop.first and m.role == 'system' %}"
        "[SYS]{{ m.content }}[/SYS]{% else %}{{ m.role | upper }}: {{ m.content[:10] }}"
        "{% endif %}{% endfor %}",
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ ns.n }}{{ m | tojson }}{% endfor %}{{ messages | length }}",
        "{% macro f(x) %}[{{ x }}]{% endmacro %}{% for m in messages | selectattr('role', "
        "'equalto', 'user') %}{{ f(m.content) }}{% endfor %}{{ raise_exception('no') if "
        "messages|length > 3 }}",
        "{{ strftime_now('%Y-%m-%d') }}{% for k, v in {'a': 1, 'b': [1, 2]} | dictsort %}"
        "{{ k }}={{ v }}{% endfor %}{{ 'x' ~ 1 + 2 * 3 }}{{ '%s' | format(1) if false }}",
    ]
    msgs = b'system\0You are helpful.\0user\0Hello \xc3\xa9\xe2\x82\xac\0assistant\0Hi!'
    for i, t in enumerate(tpls):
        put('chat', 'src%02d' % i, bytes([1, 0]) + t.encode() + b'\0' + msgs)
    for i in range(0, 60, 3):
        put('chat', 'fixture%02d' % i, bytes([0 | (i & 2), i]) + msgs)
    put('chat', 'fixture_none', bytes([2, 7]) + b'user\0\x01')


def tokenizer_seeds():
    with open(os.path.join(ROOT, 'tests', 'tokenizer', 'texts.jsonl'), encoding='utf-8') as f:
        texts = [json.loads(line) for line in f if line.strip()]
    for i, t in enumerate(texts[:30]):
        put('tokenizer', 'text%02d' % i, bytes([i % 3]) + t.encode('utf-8'))
    put('tokenizer', 'invalid0', bytes([0]) + b'\xff\xc3\x28 a\xe2\x82 \xf0\x9f\x98')
    put('tokenizer', 'invalid2', bytes([2]) + b'\xed\xa0\x80\xc0\xaf ok')
    put('tokenizer', 'special', bytes([0x0c]) + b'<s>Hello</s> <unk>')
    put('tokenizer', 'special_gpt2', bytes([0x0e]) + b'<|endoftext|>x')
    put('tokenizer', 'spaces', bytes([1]) + b'   \t\n\n  a  ')


def safetensors_file(tensors, meta=None, pad=b''):
    hdr = {}
    if meta is not None:
        hdr['__metadata__'] = meta
    data = b''
    for name, dtype, shape, size in tensors:
        hdr[name] = {'dtype': dtype, 'shape': shape,
                     'data_offsets': [len(data), len(data) + size]}
        data += bytes(size)
    h = json.dumps(hdr).encode() + pad
    return struct.pack('<Q', len(h)) + h + data


def safetensors_seeds():
    put('safetensors', 'two', safetensors_file(
        [('a.weight', 'F32', [2, 3], 24), ('b', 'F16', [4], 8)], {'format': 'pt'}))
    put('safetensors', 'dtypes', safetensors_file(
        [('x%d' % i, d, [2], 2 * s) for i, (d, s) in enumerate(
            [('BF16', 2), ('F64', 8), ('I8', 1), ('U8', 1), ('I16', 2), ('I32', 4),
             ('I64', 8), ('BOOL', 1)])]))
    put('safetensors', 'scalar_empty', safetensors_file(
        [('s', 'F32', [], 4), ('e', 'F32', [0, 5], 0)], pad=b'   '))
    put('safetensors', 'bad_offsets', struct.pack('<Q', 60) +
        b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}     ' + bytes(8))
    put('safetensors', 'huge_len', struct.pack('<Q', 1 << 62) + b'{}')


def gguf_kv(key, vtype, payload):
    k = key.encode()
    return struct.pack('<Q', len(k)) + k + struct.pack('<I', vtype) + payload


def gstr(s):
    b = s.encode()
    return struct.pack('<Q', len(b)) + b


def gguf_file(kvs, tensors, align=32, version=3):
    out = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(kvs))
    for kv in kvs:
        out += kv
    data = b''
    infos = b''
    for name, ttype, dims, nbytes in tensors:
        off = len(data)
        infos += gstr(name) + struct.pack('<I', len(dims)) + b''.join(
            struct.pack('<Q', d) for d in dims) + struct.pack('<IQ', ttype, off)
        data += bytes(nbytes)
        data += bytes((-len(data)) % align)
    out += infos
    out += bytes((-len(out)) % align)
    return out + data


def gguf_seeds():
    kvs = [
        gguf_kv('general.architecture', 8, gstr('llama')),
        gguf_kv('general.alignment', 4, struct.pack('<I', 32)),
        gguf_kv('llama.context_length', 4, struct.pack('<I', 256)),
        gguf_kv('llama.rope.freq_base', 6, struct.pack('<f', 10000.0)),
        gguf_kv('general.flag', 7, b'\x01'),
        gguf_kv('general.i64', 11, struct.pack('<q', -5)),
        gguf_kv('general.f64', 12, struct.pack('<d', 0.5)),
        gguf_kv('general.u8', 0, b'\x07'),
        gguf_kv('general.i16', 3, struct.pack('<h', -3)),
        gguf_kv('tokenizer.ggml.tokens', 9, struct.pack('<IQ', 8, 3) + gstr('<s>') +
                gstr('a') + gstr('\u2581b')),
        gguf_kv('tokenizer.ggml.scores', 9, struct.pack('<IQ', 6, 3) +
                struct.pack('<3f', 0, -1, -2)),
    ]
    tensors = [('token_embd.weight', 0, [4, 3], 48), ('blk.0.attn_q.weight', 1, [4, 4], 32),
               ('q8', 8, [32, 2], 68), ('bf', 30, [8], 16), ('q4k', 12, [256], 144)]
    put('gguf', 'model', gguf_file(kvs, tensors))
    put('gguf', 'v2_empty', gguf_file([], [], version=2))
    put('gguf', 'align64', gguf_file([gguf_kv('general.alignment', 4, struct.pack('<I', 64))],
                                     [('t', 0, [2], 8)], align=64))
    put('gguf', 'nested_arr', gguf_file([gguf_kv('a', 9, struct.pack('<IQ', 9, 1) +
                                                 struct.pack('<IQ', 4, 2) + bytes(8))], []))
    put('gguf', 'magic_only', b'GGUF\x03\x00\x00\x00')


def config_seeds():
    with open(os.path.join(ROOT, 'config', 'kvserve.conf'), 'rb') as f:
        put('config', 'example.conf', f.read())
    put('config', 'tenants.conf', """max_num_seqs = 32
block-size = 16
kv_cache_memory = 64M
drain_timeout = 250ms
kv_policy = sink=4,window=64

[serve]
port = 0
log_level = debug
enable_prefix_caching = false

[tenant default]
max_running = 8

[tenant alice]
api_key_sha256 = 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
weight = 2.5
max_kv_share = 0.5
max_waiting = 4
tokens_per_minute = 100000
prefix_cache_salt = shared

[tenant bob]
api_key_sha256 = fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9
prefix_cache_salt = shared
""")
    put('config', 'bad_value.conf', 'max_num_seqs = lots\n')
    put('config', 'bad_section.conf', '[nope]\nx = 1\n')
    put('config', 'dup.conf', 'port = 1\nport = 2\n')
    put('config', 'multiline.conf', '[serve]\nhost = a\n  b\nswap_space = 0.5\n')


def grammar_seeds():
    """Every case of tests/grammar/corpus.json with each of its documents:
    kind byte, spec, NUL, document."""
    kinds = {'json_schema': 0, 'json_object': 1, 'gbnf': 2, 'regex': 3, 'choice': 4}
    with open(os.path.join(ROOT, 'tests', 'grammar', 'corpus.json'), encoding='utf-8') as f:
        corpus = json.load(f)
    for case in corpus:
        spec = case['spec']
        spec = '' if spec is None else spec if isinstance(spec, str) else json.dumps(spec)
        for which in ('valid', 'invalid'):
            for i, doc in enumerate(case[which]):
                data = bytes([kinds[case['kind']]]) + spec.encode() + b'\0' + doc.encode()
                put('grammar', '%s-%s-%d' % (case['name'], which, i), data)


if __name__ == '__main__':
    request_seeds()
    chat_seeds()
    tokenizer_seeds()
    safetensors_seeds()
    gguf_seeds()
    config_seeds()
    grammar_seeds()
    for t in ['request', 'chat', 'tokenizer', 'safetensors', 'gguf', 'config']:
        d = os.path.join(HERE, 'regress', t)
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, '.gitkeep'), 'a').close()
