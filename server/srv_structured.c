/* srv_structured.c - the structured-output request fields (see
 * srv_structured.h). Schemas are kept as JSON text; the grammar compiler
 * (grammar/) reads them when the request is started (srv_grammar.c), so
 * every caller that fills srv_params_t.constraint (tool calling, the
 * Responses API) gets the same compile and the same errors.
 *
 * Thread: loop thread.
 */
#include "server/srv_structured.h"

#include <stdlib.h>
#include <string.h>

#include "common/xmalloc.h"

/* Field present and not null. */
static const cJSON *
fld(const cJSON *o, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    return (j == NULL || cJSON_IsNull(j)) ? NULL : j;
}

/* One source of a constraint. kind SRV_CONSTRAINT_*; v the JSON value (a
 * schema object or JSON text string for schemas, a string for regex and
 * grammar, an array of strings for choice). */
static int
set(srv_params_t *p, const char *name, int kind, const cJSON *v, const char **seen,
    srv_error_t *err)
{
    char *spec = NULL;

    if (*seen != NULL) {
        srv_err_set(err, 400, name, "'%s' and '%s' both ask for structured output; give one", *seen,
                    name);
        return 0;
    }
    *seen = name;
    switch (kind) {
    case SRV_CONSTRAINT_JSON_OBJECT:
        break;
    case SRV_CONSTRAINT_JSON_SCHEMA:
        if (cJSON_IsString(v)) {
            spec = xstrdup_try(v->valuestring);
        } else if (cJSON_IsObject(v) || cJSON_IsBool(v)) {
            spec = cJSON_PrintUnformatted(v);
        } else {
            srv_err_set(err, 400, name, "'%s' must be a JSON schema object", name);
            return 0;
        }
        break;
    case SRV_CONSTRAINT_REGEX:
    case SRV_CONSTRAINT_GBNF:
        if (!cJSON_IsString(v)) {
            srv_err_set(err, 400, name, "'%s' must be a string", name);
            return 0;
        }
        spec = xstrdup_try(v->valuestring);
        break;
    case SRV_CONSTRAINT_CHOICE:
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0) {
            srv_err_set(err, 400, name, "'%s' must be a non-empty array of strings", name);
            return 0;
        }
        for (const cJSON *c = v->child; c != NULL; c = c->next) {
            if (!cJSON_IsString(c)) {
                srv_err_set(err, 400, name, "'%s' must be a non-empty array of strings", name);
                return 0;
            }
        }
        spec = cJSON_PrintUnformatted(v);
        break;
    default:
        break;
    }
    if (kind != SRV_CONSTRAINT_JSON_OBJECT && spec == NULL) {
        srv_err_set(err, 503, NULL, "out of memory");
        return 0;
    }
    free(p->constraint.spec);
    p->constraint.kind = kind;
    p->constraint.spec = spec;
    return 1;
}

static int
parse_response_format(const cJSON *rf, srv_params_t *p, const char **seen, srv_error_t *err)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");

    if (!cJSON_IsObject(rf) || !cJSON_IsString(t)) {
        srv_err_set(err, 400, "response_format",
                    "'response_format' must be an object with a string 'type'");
        return 0;
    }
    if (strcmp(t->valuestring, "text") == 0) {
        return 1;
    }
    if (strcmp(t->valuestring, "json_object") == 0) {
        return set(p, "response_format", SRV_CONSTRAINT_JSON_OBJECT, NULL, seen, err);
    }
    if (strcmp(t->valuestring, "json_schema") == 0) {
        const cJSON *js = fld(rf, "json_schema");
        const cJSON *sc = js != NULL ? fld(js, "schema") : NULL;
        if (!cJSON_IsObject(js)) {
            srv_err_set(err, 400, "response_format.json_schema",
                        "response_format type 'json_schema' needs a 'json_schema' object");
            return 0;
        }
        const cJSON *name = fld(js, "name");
        if (name != NULL && !cJSON_IsString(name)) {
            srv_err_set(err, 400, "response_format.json_schema.name",
                        "'json_schema.name' must be a string");
            return 0;
        }
        if (sc == NULL) {
            /* No schema: any JSON object, as a bare json_object. */
            return set(p, "response_format", SRV_CONSTRAINT_JSON_OBJECT, NULL, seen, err);
        }
        if (!cJSON_IsObject(sc)) {
            srv_err_set(err, 400, "response_format.json_schema.schema",
                        "'json_schema.schema' must be an object");
            return 0;
        }
        /* strict true or false: the schema is always enforced. */
        return set(p, "response_format", SRV_CONSTRAINT_JSON_SCHEMA, sc, seen, err);
    }
    srv_err_set(err, 400, "response_format",
                "response_format type '%s' is not supported (text, json_object, json_schema)",
                t->valuestring);
    return 0;
}

int
srv_constraint_parse(const cJSON *root, srv_params_t *p, srv_error_t *err)
{
    const char *seen = NULL;
    const cJSON *j;
    static const struct {
        const char *name;
        int kind;
    } guided[] = {
        {"guided_json", SRV_CONSTRAINT_JSON_SCHEMA},
        {"guided_regex", SRV_CONSTRAINT_REGEX},
        {"guided_choice", SRV_CONSTRAINT_CHOICE},
        {"guided_grammar", SRV_CONSTRAINT_GBNF},
        {"grammar", SRV_CONSTRAINT_GBNF},
        {"json_schema", SRV_CONSTRAINT_JSON_SCHEMA},
    };

    if ((j = fld(root, "response_format")) && !parse_response_format(j, p, &seen, err)) {
        return 0;
    }
    if ((j = fld(root, "structured_outputs"))) {
        static const struct {
            const char *name, *param;
            int kind;
        } so[] = {
            {"json", "structured_outputs.json", SRV_CONSTRAINT_JSON_SCHEMA},
            {"regex", "structured_outputs.regex", SRV_CONSTRAINT_REGEX},
            {"choice", "structured_outputs.choice", SRV_CONSTRAINT_CHOICE},
            {"grammar", "structured_outputs.grammar", SRV_CONSTRAINT_GBNF},
        };
        if (!cJSON_IsObject(j)) {
            srv_err_set(err, 400, "structured_outputs", "'structured_outputs' must be an object");
            return 0;
        }
        for (const cJSON *k = j->child; k != NULL; k = k->next) {
            int known = 0;
            for (size_t i = 0; i < sizeof(so) / sizeof(so[0]); i++) {
                known |= strcmp(k->string, so[i].name) == 0;
            }
            if (!known && strcmp(k->string, "json_object") != 0 && !cJSON_IsNull(k) &&
                !(cJSON_IsFalse(k) || (cJSON_IsString(k) && k->valuestring[0] == '\0'))) {
                srv_err_set(err, 400, "structured_outputs",
                            "structured_outputs.%s is not supported (json, regex, choice, "
                            "grammar, json_object)",
                            k->string);
                return 0;
            }
        }
        for (size_t i = 0; i < sizeof(so) / sizeof(so[0]); i++) {
            const cJSON *v = fld(j, so[i].name);
            if (v != NULL && !set(p, so[i].param, so[i].kind, v, &seen, err)) {
                return 0;
            }
        }
        const cJSON *jo = fld(j, "json_object");
        if (jo != NULL && cJSON_IsTrue(jo) &&
            !set(p, "structured_outputs.json_object", SRV_CONSTRAINT_JSON_OBJECT, NULL, &seen,
                 err)) {
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof(guided) / sizeof(guided[0]); i++) {
        const cJSON *v = fld(root, guided[i].name);
        if (v != NULL && !set(p, guided[i].name, guided[i].kind, v, &seen, err)) {
            return 0;
        }
    }
    return 1;
}
