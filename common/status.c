/* status.c - status code strings and the always-on check failure path. */
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *
st_str(int status)
{
    switch (status) {
    case ST_OK:
        return "ok";
    case ST_ECUDA:
        return "CUDA error";
    case ST_ENCCL:
        return "NCCL error";
    case ST_EFORMAT:
        return "malformed input";
    case ST_ESHUTDOWN:
        return "shutting down";
    case ST_EQUEUE:
        return "queue full";
    case ST_ETOOLONG:
        return "request too long";
    case ST_ENODEV:
        return "no device";
    case ST_EUNSUPPORTED:
        return "unsupported";
    default:
        break;
    }
    if (status < 0 && status > -4096) {
        return strerror(-status);
    }
    return "unknown status";
}

_Noreturn void
check_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "<2>CHECK failed: %s at %s:%d\n", expr, file, line);
    fflush(stderr);
    abort();
}
