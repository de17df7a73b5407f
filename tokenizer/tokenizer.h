/*
 * tokenizer.h - byte-level BPE tokenizer loaded from a Hugging Face
 * tokenizer.json, producing the same ids as HF `tokenizers`.
 *
 * This module owns everything between text and token ids: parsing
 * tokenizer.json (cJSON), added/special tokens, the NFC normalizer
 * (utf8proc), the pre-tokenizer regexes taken from the file (run by PCRE2 with
 * UTF + UCP, JIT when available), byte-level BPE merging, decoding (one-shot
 * and streaming), ChatML prompt formatting and the tokenizer fingerprint that
 * the compatibility rules compare between drafters and verifiers.
 *
 * The pipeline of tdm_tok_encode is HF's:
 *   1. added tokens whose "normalized" is false are matched in the raw text
 *      (leftmost, then longest; lstrip/rstrip absorb Unicode whitespace);
 *   2. every other piece is normalized (NFC when configured), then added
 *      tokens whose "normalized" is true are matched in it;
 *   3. the remaining pieces go through the pre-tokenizer steps (Split with a
 *      regex or string, behaviour Isolated; ByteLevel, optionally with the
 *      GPT-2 regex) and each word is merged by BPE (lowest merge rank first,
 *      leftmost on ties; with ignore_merges a word that is a vocabulary entry
 *      is taken whole).
 *
 * Supported tokenizer.json features (anything else is refused at load time
 * with an error naming the feature and its JSON path): model BPE without
 * dropout, byte_fallback, subword prefix/suffix (unk_token only if every
 * byte has a token, so it can never be produced); normalizer null, NFC, or a
 * Sequence of NFC; pre_tokenizer ByteLevel (add_prefix_space false) or a
 * Sequence of Split steps ending in ByteLevel; decoder ByteLevel; post_processor
 * null or ByteLevel; truncation and padding null; added tokens without
 * single_word.
 *
 * HF runs the pre-tokenizer regexes with Oniguruma; PCRE2 runs them here
 * after one translation: \s and \S are spelled out as the Unicode
 * White_Space set, which is Oniguruma's \s (PCRE2 10.42's also matches
 * U+180E). Anything else in a pattern is passed to PCRE2 as written.
 *
 * Thread safety: a loaded tokenizer does not change (its word cache has its
 * own lock, never waited on); any number of threads may
 * encode/decode with it at once. A stream belongs to one thread at a time.
 *
 * Fingerprint: SHA-256 over a canonical byte stream that does not depend on
 * the JSON's formatting or key order. Every item is written as a field =
 * little-endian u32 length followed by that many bytes; integers are fields
 * holding their decimal text. In this order:
 *   "tandem.tokenizer.v1"
 *   "normalizer", then "NFC" or "none"
 *   "pre_tokenizer", the step count, then per step either
 *       "Split", "Regex" or "String", the pattern, "Isolated", "invert=0"
 *       or "ByteLevel", "add_prefix_space=0", "use_regex=0|1"
 *   "model", "BPE", "ignore_merges=0|1"
 *   "vocab", the count, then per entry in increasing id order: id, token
 *   "merges", the count, then per merge in rank order: left token, right token
 *   "added", the count, then per added token in increasing id order: id,
 *       content, "special=0|1 normalized=0|1 lstrip=0|1 rstrip=0|1"
 *   "decoder", "ByteLevel"
 * Two files with the same fingerprint produce the same ids for every text.
 */
#ifndef TANDEM_COMMON_TOKENIZER_H
#define TANDEM_COMMON_TOKENIZER_H

#include "status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tdm_tokenizer tdm_tokenizer;

/* Loads a tokenizer.json file. On success *out is owned by the caller
 * (tdm_tok_destroy). A missing file is TDM_ERR_NOT_FOUND; malformed JSON and
 * unsupported features are TDM_ERR_INVALID_ARGUMENT / TDM_ERR_UNIMPLEMENTED. */
tdm_status tdm_tok_load(const char *path, tdm_tokenizer **out, tdm_error *err);

/* Same from a buffer holding the JSON text (len bytes, need not end in NUL).
 * `origin` names the source in error messages (a path, "<buffer>"). */
tdm_status tdm_tok_load_json(const char *json, size_t len, const char *origin, tdm_tokenizer **out,
                             tdm_error *err);

void tdm_tok_destroy(tdm_tokenizer *tok);

/* Text (len bytes of UTF-8) -> ids. *ids is malloc'd and owned by the caller
 * (free()); *n_ids may be 0 (then *ids may be NULL). Invalid UTF-8 is
 * TDM_ERR_INVALID_ARGUMENT with the byte offset in the message. */
tdm_status tdm_tok_encode(const tdm_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                          size_t *n_ids, tdm_error *err);

/* Ids -> text, as HF's decode: token bytes concatenated, invalid UTF-8
 * replaced by U+FFFD (one per maximal invalid subpart). With skip_special,
 * added tokens marked special are left out. *text is malloc'd, NUL-terminated
 * and owned by the caller; *len (optional) excludes the NUL. An id that is
 * negative, >= vocab size or names no token is TDM_ERR_OUT_OF_RANGE. */
tdm_status tdm_tok_decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n_ids,
                          bool skip_special, char **text, size_t *len, tdm_error *err);

/* Streaming decoder: push one id at a time, get the text it completes. Bytes
 * of an unfinished UTF-8 character are held back until it completes (or
 * turns out invalid), so the concatenation of all pushes and the final flush
 * equals tdm_tok_decode over the same ids. */
typedef struct tdm_tok_stream tdm_tok_stream;

/* *out is owned by the caller (tdm_tok_stream_destroy); tok must outlive it. */
tdm_status tdm_tok_stream_create(const tdm_tokenizer *tok, bool skip_special, tdm_tok_stream **out,
                                 tdm_error *err);
/* *text points into the stream's buffer (NUL-terminated, *len bytes, maybe
 * 0) and stays valid until the next push/flush/destroy. */
tdm_status tdm_tok_stream_push(tdm_tok_stream *s, int32_t id, const char **text, size_t *len,
                               tdm_error *err);
/* Emits what is held back (an unfinished character becomes U+FFFD) and
 * resets the stream for reuse. */
void tdm_tok_stream_flush(tdm_tok_stream *s, const char **text, size_t *len);
void tdm_tok_stream_destroy(tdm_tok_stream *s);

/* ChatML, the Qwen chat format. */
typedef struct tdm_tok_message {
    const char *role;    /* "system", "user", "assistant", "tool", ... */
    const char *content; /* UTF-8 */
} tdm_tok_message;

/* "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
 * "<|im_start|>assistant\n" when add_generation_prompt. *text is malloc'd,
 * NUL-terminated, owned by the caller. A NULL/empty role, a role with a
 * newline or a NULL content is TDM_ERR_INVALID_ARGUMENT. */
tdm_status tdm_tok_chatml(const tdm_tok_message *msgs, size_t n_msgs, bool add_generation_prompt,
                          char **text, size_t *len, tdm_error *err);

/* tdm_tok_chatml then tdm_tok_encode; fails with TDM_ERR_FAILED_PRECONDITION
 * when the tokenizer lacks <|im_start|> or <|im_end|>. *ids as encode. */
tdm_status tdm_tok_encode_chat(const tdm_tokenizer *tok, const tdm_tok_message *msgs, size_t n_msgs,
                               bool add_generation_prompt, int32_t **ids, size_t *n_ids,
                               tdm_error *err);

/* TDM_OK when text[0..len) is valid UTF-8; INVALID_ARGUMENT naming the
 * offset of the first byte that is not (what tdm_tok_encode checks first). */
tdm_status tdm_tok_check_utf8(const char *text, size_t len, tdm_error *err);

/* text[0..len) made valid UTF-8 the way tdm_tok_decode does it: each
 * maximal invalid subpart, and a character cut off by the end, becomes one
 * U+FFFD. *out is malloc'd, NUL-terminated and owned by the caller; *out_len
 * (optional) excludes the NUL. RESOURCE_EXHAUSTED when out of memory. */
tdm_status tdm_tok_utf8_lossy(const char *text, size_t len, char **out, size_t *out_len);

/* One past the largest id (vocabulary plus added tokens). */
size_t tdm_tok_vocab_size(const tdm_tokenizer *tok);

/* Token string (as stored in the file, byte-level alphabet for vocabulary
 * entries) -> id; added tokens first, as HF. -1 when absent. */
int32_t tdm_tok_token_to_id(const tdm_tokenizer *tok, const char *token, size_t len);

/* id -> token string owned by the tokenizer (not NUL-terminated: use *len);
 * NULL when the id is out of range or names no token. */
const char *tdm_tok_id_to_token(const tdm_tokenizer *tok, int32_t id, size_t *len);

/* True for added tokens marked special. */
bool tdm_tok_is_special(const tdm_tokenizer *tok, int32_t id);

/* Ids of the well-known special tokens, -1 where the tokenizer has none.
 * eos is what ends an assistant turn: <|im_end|> when present, else
 * <|endoftext|>; pad is <|endoftext|>. */
typedef struct tdm_tok_specials {
    int32_t endoftext;
    int32_t im_start;
    int32_t im_end;
    int32_t eos;
    int32_t pad;
} tdm_tok_specials;

const tdm_tok_specials *tdm_tok_specials_get(const tdm_tokenizer *tok);

/* The fingerprint described above, as 64 lowercase hex digits + NUL. */
tdm_status tdm_tok_fingerprint(const tdm_tokenizer *tok, char out_hex[65]);

/* Loads `path`, fingerprints it and frees it again. */
tdm_status tdm_tok_fingerprint_file(const char *path, char out_hex[65], tdm_error *err);

#endif
