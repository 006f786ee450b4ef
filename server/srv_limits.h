/* srv_limits.h - request limits checked before any costly work (issue 15):
 * a prompt's byte length against what the context can hold, and the length
 * of stop strings.
 *
 * DESIGN. Tokenizing (on libuv's thread pool, srv_work.h) costs more than
 * linear time in the worst case for byte-level BPE: an 8 MiB prompt that
 * can only end in a 400 must not be tokenized first. No token covers more
 * input bytes than SRV_PROMPT_BYTES_PER_TOKEN times the longest vocabulary
 * entry (the entry's stored form is never shorter than the text it stands
 * for; the factor covers normalization that shortens the input), so a text
 * longer than that times max_model_len tokens cannot fit, and is refused
 * on its length.
 * Stop strings are matched against the held-back text after every token
 * (O(len^2) per check in the worst case): each is capped at
 * SRV_MAX_STOP_BYTES (srv_int.h, checked by srv_params.c).
 *
 * Thread: any (the per-tokenizer cache of srv_prompt_byte_cap is locked).
 */
#ifndef SERVER_SRV_LIMITS_H
#define SERVER_SRV_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define SRV_PROMPT_BYTES_PER_TOKEN 4

/* The largest prompt text, in bytes, that could tokenize to at most
 * max_model_len tokens with tok. Computed once per tokenizer (a pass over
 * the vocabulary), then O(1). */
size_t srv_prompt_byte_cap(const tok_tokenizer_t *tok, int32_t max_model_len);

#endif /* SERVER_SRV_LIMITS_H */
