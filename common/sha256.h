/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for request fingerprints
 * (Idempotency-Key bodies must not collide the way a 64-bit FNV hash can be
 * made to) and signed webhooks. Pure functions over caller memory: no
 * allocation, safe from any thread.
 */
#ifndef JD_COMMON_SHA256_H
#define JD_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define JD_SHA256_LEN 32
#define JD_SHA256_HEX_LEN 64 /* without the terminating NUL */

struct jd_sha256 {
    uint32_t h[8];
    uint64_t bytes;  /* message length so far */
    uint8_t buf[64]; /* a partial block */
    size_t buf_len;
};

void jd_sha256_init(struct jd_sha256 *c);
void jd_sha256_update(struct jd_sha256 *c, const void *data, size_t len);
void jd_sha256_final(struct jd_sha256 *c, uint8_t out[JD_SHA256_LEN]);

/* One-shot digest; `hex` gets 64 lowercase hex digits and a NUL. */
void jd_sha256(const void *data, size_t len, uint8_t out[JD_SHA256_LEN]);
void jd_sha256_hex(const void *data, size_t len, char hex[JD_SHA256_HEX_LEN + 1]);

/* HMAC-SHA256 of msg under key (any length). */
void jd_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                    uint8_t out[JD_SHA256_LEN]);

/* Lowercase hex of n bytes into hex (2n+1 bytes with the NUL). */
void jd_hex(const uint8_t *bytes, size_t n, char *hex);

#endif
