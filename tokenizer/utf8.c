/*
 * utf8.c - UTF-8 as the tokenizer needs it: classifying a sequence the way
 * HF's lossy decoding does, checking input text, writing and reading one
 * code point, and GPT-2's byte-level alphabet (the 256 visible characters
 * that byte-level BPE spells bytes with) with the bytes a token decodes to.
 */
#include "tokenizer_internal.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

/* Classifies the sequence at p[0..n): > 0 = a complete valid character of
 * that many bytes; < 0 = invalid, -k = its maximal invalid subpart has k bytes
 * (Unicode's "substitution of maximal subparts", which Rust's
 * from_utf8_lossy and hence HF's decode follow); 0 = a valid but unfinished
 * prefix (needs more bytes than n). */
int tok__utf8_class(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n)
            return 0;
        unsigned char b = p[k];
        unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h)
            return -k;
    }
    return need;
}

tdm_status tdm_tok_check_utf8(const char *text, size_t len, tdm_error *err)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int c = tok__utf8_class(p + i, len - i);
        if (c <= 0)
            return tdm_error_set(err, TDM_ERR_INVALID_ARGUMENT,
                                 "text is not valid UTF-8: %s 0x%02x at byte offset %zu",
                                 c == 0 ? "the text ends inside a character starting with byte"
                                        : "invalid sequence starting with byte",
                                 p[i], i);
        i += (size_t)c;
    }
    return TDM_OK;
}

/* ------------------------------------------------------------------------ */
/* Byte-level alphabet                                                      */
/* ------------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order, so every byte is a visible char. */
void tok__byte_level_table(uint32_t cp_of_byte[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep =
            (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

int tok__utf8_put(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t tok__utf8_get(const unsigned char *p, int n)
{
    if (n == 1)
        return p[0];
    if (n == 2)
        return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    if (n == 3)
        return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
           ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

/* The bytes HF's ByteLevel decoder makes of one token: every char mapped
 * back to its byte, or the token's own UTF-8 when any char is outside the
 * alphabet (added tokens such as "<|im_end|>" come out verbatim either way). */
bool tok__token_decoded_bytes(const char *s, uint32_t len, const int byte_of_cp[512], char *out,
                              uint32_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s;
    uint32_t i = 0, o = 0;
    while (i < len) {
        int c = tok__utf8_class(p + i, len - i);
        if (c <= 0)
            return false;
        uint32_t cp = tok__utf8_get(p + i, c);
        if (cp >= 512 || byte_of_cp[cp] < 0) {
            memcpy(out, s, len);
            *out_len = len;
            return true;
        }
        out[o++] = (char)byte_of_cp[cp];
        i += (uint32_t)c;
    }
    *out_len = o;
    return true;
}
