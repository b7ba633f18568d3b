/*
 * SHA-256 and HMAC-SHA256 against the published vectors (FIPS 180-4
 * examples, RFC 4231), and incremental hashing in uneven pieces.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/sha256.h"

#include <stdlib.h>
#include <string.h>

static void hex_of(const char *msg, size_t len, char out[65])
{
    jd_sha256_hex(msg, len, out);
}

static void test_fips_vectors(void **state)
{
    (void)state;
    char h[65];
    hex_of("", 0, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m448, strlen(m448), h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    memset(million, 'a', 1000000);
    hex_of(million, 1000000, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

/* Every length around the padding boundaries (55, 56, 63, 64 bytes), fed in
 * pieces of every size, gives the one-shot digest. */
static void test_incremental_matches_one_shot(void **state)
{
    (void)state;
    uint8_t msg[200];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 7 + 3);
    for (size_t len = 0; len <= sizeof msg; len++) {
        uint8_t want[32], got[32];
        jd_sha256(msg, len, want);
        for (size_t piece = 1; piece <= 70; piece += 3) {
            struct jd_sha256 c;
            jd_sha256_init(&c);
            for (size_t off = 0; off < len; off += piece)
                jd_sha256_update(&c, msg + off, len - off < piece ? len - off : piece);
            jd_sha256_final(&c, got);
            assert_memory_equal(got, want, 32);
        }
    }
}

static void hmac_hex(const void *key, size_t klen, const char *msg, char out[65])
{
    uint8_t d[32];
    jd_hmac_sha256(key, klen, msg, strlen(msg), d);
    jd_hex(d, 32, out);
}

static void test_rfc4231_hmac(void **state)
{
    (void)state;
    char h[65];
    uint8_t k1[20];
    memset(k1, 0x0b, sizeof k1);
    hmac_hex(k1, sizeof k1, "Hi There", h);
    assert_string_equal(h, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    hmac_hex("Jefe", 4, "what do ya want for nothing?", h);
    assert_string_equal(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    uint8_t k6[131];
    memset(k6, 0xaa, sizeof k6); /* longer than a block: hashed first */
    hmac_hex(k6, sizeof k6, "Test Using Larger Than Block-Size Key - Hash Key First", h);
    assert_string_equal(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fips_vectors),
        cmocka_unit_test(test_incremental_matches_one_shot),
        cmocka_unit_test(test_rfc4231_hmac),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
