"""Okamoto-Uchiyama on gmpy2 (fedgrove.crypto.ou): the key's structure, both ways of encrypting, the plaintext
bound, and HEU's ciphertexts decrypted by this code (the same scheme)."""

import re

import gmpy2
import pytest

from fedgrove.crypto import ou
from fedgrove.crypto.he import available_backends, keygen, public_context
from fedgrove.exceptions import ProtocolError


@pytest.fixture(scope="module")
def keys():
    return ou.generate(2048)


def test_a_key_has_the_sizes_and_structure_the_scheme_needs(keys):
    pk, sk = keys
    p, q, t = sk.p, sk.q, sk.t
    assert pk.n == p * p * q and pk.n.bit_length() == 2048
    assert p.bit_length() == ou.p_bits(2048) == 683 and gmpy2.is_prime(p) and gmpy2.is_prime(q) and p != q
    assert t.bit_length() == 224 and gmpy2.is_prime(t) and (p - 1) % t == 0 and (q - 1) % t and (q - 1) % p
    assert gmpy2.is_prime((q - 1) // 2) and sk.squares  # a safe prime; H's powers modulo q are the squares
    assert sk.linear  # G modulo p^2 of order dividing p t, a square modulo q: the key holder's short way
    assert pk.h % q != 1 and gmpy2.powmod(pk.h, (q - 1) // 2, q) == 1
    p2 = p * p
    assert gmpy2.powmod(pk.h, t, p2) == 1 and pk.h % p2 != 1  # order t: the randomness vanishes when decrypting
    gt = gmpy2.powmod(pk.g, t, p2)
    assert gt != 1 and gmpy2.powmod(gt, p, p2) == 1  # G^t generates the subgroup of order p
    assert pk.plaintext_bits == 681 and (1 << 681) < p // 2
    assert q.bit_length() + t.bit_length() + ou.STATISTICAL_BITS <= ou.public_r_bits(2048)


def _general(sk):
    """The same key, its holder encrypting the general way (G^m H^r by the CRT), as for keys not made here."""
    other = ou.SecretKey(sk.public, sk.p, sk.q, sk.t)
    other.linear = False
    return other


def test_key_holder_and_public_encryptions_decrypt_and_add_up_together(keys):
    pk, sk = keys
    top = (1 << pk.plaintext_bits) - 1
    values = [0, 1, -1, 7, -123456789, top, -top, 1 << 400]
    crt, public = sk.encrypt(values), pk.encrypt(values)
    assert sk.decrypt(crt) == values and sk.decrypt(public) == values
    assert sk.decrypt(_general(sk).encrypt(values)) == values
    n = pk.n
    assert sk.decrypt([a * b % n for a, b in zip(crt[:4], public[:4])]) == [2 * v for v in values[:4]]
    assert sk.decrypt([gmpy2.powmod(c, -3, n) for c in crt[:5]]) == [-3 * v for v in values[:5]]
    assert sk.decrypt([crt[3] * pk.g_pow(-10) % n]) == [-3]  # the plaintext added without randomness


def test_every_encryptions_randomness_lies_in_the_group_h_generates(keys):
    # c G^-m is H^r: its order divides H's, t q' (the key holder's CRT encryption draws the same group's elements)
    pk, sk = keys
    order_h = sk.t * ((sk.q - 1) // 2)
    assert gmpy2.powmod(pk.h, order_h, pk.n) == 1
    values = [0, 9, -(1 << 100), (1 << 680) - 3]
    for c, m in zip(sk.encrypt(values) + _general(sk).encrypt(values) + pk.encrypt(values), values * 3):
        rho = c * pk.g_pow(-m) % pk.n
        assert gmpy2.powmod(rho, order_h, pk.n) == 1 and rho != 1
        assert gmpy2.jacobi(rho % sk.q, sk.q) == 1  # a square modulo q


def test_encryptions_of_one_value_differ(keys):
    pk, sk = keys
    for encrypt in (sk.encrypt, _general(sk).encrypt, pk.encrypt):
        c = encrypt([5] * 50)
        assert len(set(c)) == 50 and all(0 < x < pk.n for x in c)


def test_plaintexts_beyond_the_bound_are_refused():
    he = keygen("ou", 2048, "gmpy2")
    top = (1 << he.plaintext_bits) - 1
    assert he.decrypt(he.encrypt([top, -top])) == [top, -top]
    for bad in (top + 1, -top - 1):
        with pytest.raises(ProtocolError, match="681"):
            he.encrypt([bad])
        with pytest.raises(ProtocolError, match="681"):
            he.add_plain(he.encrypt([0]), [bad])


def test_the_public_key_travels_and_encrypts_for_the_key_holder():
    he = keygen("ou", 2048, "gmpy2")
    pub = public_context(he.public_bytes())
    assert (pub.backend, pub.scheme, pub.key_bits, pub.has_secret) == ("gmpy2", "ou", 2048, False)
    assert pub.plaintext_bits == he.plaintext_bits
    ct = pub.add(pub.encrypt([5, -6]), pub.deserialize(he.serialize(he.encrypt([10, 10]))))
    assert he.decrypt(he.deserialize(pub.serialize(ct))) == [15, 4]
    with pytest.raises(ProtocolError, match="holds no secret key"):
        pub.decrypt(ct)
    key = he.public_bytes()
    with pytest.raises(ProtocolError, match="malformed public key"):
        public_context(key[:-1])
    with pytest.raises(ProtocolError, match="outside Z_n"):
        he.deserialize(b"\xff" * 256)  # above n
    with pytest.raises(ProtocolError, match="outside Z_n"):
        he.deserialize(b"\x00" * 256)


def test_heus_ou_ciphertexts_decrypt_under_this_code():
    # the same scheme as SecretFlow's HEU: its key's numbers (as its keys print them) and ciphertexts, decrypted
    # with this module's arithmetic, and sums of them taken here
    if "heu" not in available_backends():
        pytest.skip("sf-heu not installed")
    import numpy as np
    from heu import numpy as hnp
    from heu import phe

    kit = hnp.setup(phe.SchemaType.OU, 2048)

    def number(text, name):
        return int(re.search(rf"\b{name}=([0-9A-F]+)\[", text).group(1), 16)

    pk_text, sk_text = str(kit.public_key()), str(kit.secret_key())
    n, g, h = (number(pk_text, k) for k in ("n", "G", "H"))
    p, q = number(sk_text, "p"), number(sk_text, "q")
    mine = ou.SecretKey(ou.PublicKey(n, g, h, 2048), p, q, p - 1)  # HEU's t is not printed: p - 1 serves
    values = [0, 3, -3, 1 << 120, -(1 << 300), 987654321]
    encoder = phe.BigintEncoder(phe.SchemaType.OU)
    cts = kit.encryptor().encrypt(hnp.array(np.array(values, dtype=object).reshape(-1, 1), encoder))
    # HEU keeps a ciphertext in Montgomery form, times R = 2^(60 k) modulo n for the k 60-bit digits of n (its
    # integers are libtommath's)
    r_inv = pow(pow(2, 60 * -(-n.bit_length() // 60), n), -1, n)
    theirs = [gmpy2.mpz(int(str(cts[i, 0])) * r_inv % n) for i in range(len(values))]
    assert mine.decrypt(theirs) == values
    assert mine.decrypt([theirs[1] * theirs[4] % n]) == [3 - (1 << 300)]
    assert not mine.squares and not mine.linear  # HEU's q is no safe prime: the key holder raises H modulo q
    assert mine.decrypt(mine.public.encrypt(values)) == values  # this code's encryptions under HEU's key
    assert mine.decrypt(mine.encrypt(values)) == values


def test_long_lists_decrypt_alike_on_several_threads(keys, monkeypatch):
    # from THREADED_DECRYPTION ciphertexts on, the list is cut into a piece a thread: the same plaintexts in order
    pk, sk = keys
    values = [(k * 7919) % 1000 - 500 for k in range(ou.THREADED_DECRYPTION + 77)]
    cts = sk.encrypt(values)
    for n in (1, 3, 8):
        monkeypatch.setattr(ou, "_threads", n)
        assert ou.decryption_threads() == n and sk.decrypt(cts) == values
