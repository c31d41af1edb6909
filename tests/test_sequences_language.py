"""The tiny language: masks (EOS is real, PAD is not), masked sums, features, and the prefix tree
checked against a brute-force itertools enumeration."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.sequences import language
from seq_support import brute_force_responses, features_np, tokens_of

SMALL = sq.Language(n_prompts=2, n_tokens=3, max_len=3)
EOS, PAD = 5, 6  # default language


def test_default_sizes():
    lang = sq.DEFAULT_LANGUAGE
    assert (lang.n_prompts, lang.n_tokens, lang.max_len) == (4, 5, 6)
    assert (lang.eos, lang.pad, lang.n_actions) == (EOS, PAD, 6)
    assert lang.n_responses == sum(5**k for k in range(7)) == 19531
    assert lang.n_prefixes == sum(5**k for k in range(6)) == 3906


@pytest.mark.parametrize("lang", [SMALL, sq.Language(n_prompts=1, n_tokens=2, max_len=4), sq.DEFAULT_LANGUAGE])
def test_tree_enumerates_every_response_once(lang):
    tree = sq.prefix_tree(lang)
    got = [tokens_of(r, lang.pad) for r in tree.response_tokens]
    expected = brute_force_responses(lang.n_tokens, lang.max_len)
    assert len(got) == len(set(got)) == lang.n_responses
    assert set(got) == set(expected)


def test_tree_layout_eos_responses_follow_prefixes():
    tree = sq.prefix_tree(SMALL)
    for j, row in enumerate(tree.prefix_tokens):
        prefix = tokens_of(row, SMALL.pad)
        assert tokens_of(tree.response_tokens[j], SMALL.pad) == prefix + (SMALL.eos,)
        assert tree.prefix_level[j] == len(prefix)
    # children of prefix i on level k are i * V + a on level k + 1
    off = tree.level_offsets
    for i in range(tree.level_sizes[1]):
        for a in range(SMALL.n_tokens):
            child = tokens_of(tree.prefix_tokens[off[2] + i * SMALL.n_tokens + a], SMALL.pad)
            assert child == tokens_of(tree.prefix_tokens[off[1] + i], SMALL.pad) + (a,)


def test_tree_statistics_by_hand():
    tree = sq.prefix_tree(SMALL)
    for j, row in enumerate(tree.response_tokens):
        toks = tokens_of(row, SMALL.pad)
        content = [t for t in toks if t < SMALL.n_tokens]
        assert tree.length[j] == len(content)
        assert tree.has_eos[j] == (toks[-1] == SMALL.eos)
        assert list(tree.counts[j]) == [content.count(v) for v in range(SMALL.n_tokens)]
        assert tree.response_mask[j].sum() == len(toks)
        # response_prefix/action name the decision point and the action of every real token
        for t, tok in enumerate(toks):
            assert tokens_of(tree.prefix_tokens[tree.response_prefix[j, t]], SMALL.pad) == toks[:t]
            assert tree.response_action[j, t] == tok
        assert all(tree.response_prefix[j, len(toks):] == -1)


def test_prefix_features_match_definition():
    tree = sq.prefix_tree(SMALL)
    for p in range(SMALL.n_prompts):
        for j, row in enumerate(tree.prefix_tokens):
            expected = features_np(2, 3, 3, p, list(tokens_of(row, SMALL.pad)))
            np.testing.assert_allclose(tree.prefix_features[p, j], expected, atol=1e-7)


def test_context_features_match_definition_per_position():
    tokens = np.array([[0, 2, 2], [1, 3, 4], [3, 4, 4]])  # SMALL: EOS = 3, PAD = 4
    prompts = np.array([1, 0, 1])
    got = np.asarray(sq.context_features(SMALL, prompts, tokens))
    for b in range(3):
        for t in range(3):
            if t == 0 or tokens[b, t - 1] < 3:
                expected = features_np(2, 3, 3, prompts[b], [int(x) for x in tokens[b, :t]])
                np.testing.assert_allclose(got[b, t], expected, atol=1e-7)


def test_response_mask_eos_is_real_and_pad_is_not():
    tokens = jnp.array([
        [0, 1, EOS, PAD, PAD, PAD],   # ended: EOS counts
        [EOS, PAD, PAD, PAD, PAD, PAD],  # length 1: only EOS
        [0, 1, 2, 3, 4, 0],           # truncated: all real, no EOS
    ])
    mask = np.asarray(sq.response_mask(tokens, EOS, PAD))
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    # the classic mistake (EOS used as padding, mask = tokens != EOS) would drop the EOS itself
    wrong = np.asarray(tokens != EOS, np.float32)
    assert wrong[0, 2] == 0 and mask[0, 2] == 1


def test_response_mask_rejects_eos_equal_pad():
    with pytest.raises(ValueError, match="eos and pad must be different"):
        sq.response_mask(jnp.zeros((1, 3), jnp.int32), 3, 3)


def test_sequence_logprob_and_masked_nll_by_hand():
    token_logp = jnp.array([[-0.5, -1.0, -2.0], [-0.25, -7.0, -9.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(sq.sequence_logprob(token_logp, mask), [-1.5, -0.25], rtol=1e-6)
    # 3 real tokens in total: (0.5 + 1.0 + 0.25) / 3
    np.testing.assert_allclose(sq.masked_nll(token_logp, mask), 1.75 / 3, rtol=1e-6)
    # padding values never matter, even huge ones
    bad = token_logp.at[:, 2].set(-1e30)
    np.testing.assert_allclose(sq.sequence_logprob(bad, mask), [-1.5, -0.25], rtol=1e-6)


def test_decode():
    assert sq.decode(sq.DEFAULT_LANGUAGE, [0, 2, EOS, PAD, PAD, PAD]) == "a c <eos>"
    assert sq.decode(sq.DEFAULT_LANGUAGE, [EOS, PAD, PAD, PAD, PAD, PAD]) == "<eos>"
    assert sq.decode(sq.DEFAULT_LANGUAGE, [1, 1, 1, 1, 1, 1]) == "b b b b b b ..."
    with pytest.raises(ValueError, match="tokens must be ids"):
        sq.decode(sq.DEFAULT_LANGUAGE, [9])


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_tokens=1), "n_tokens must be an integer >= 2"),
    (dict(n_prompts=0), "n_prompts must be an integer >= 1"),
    (dict(max_len=0), "max_len must be an integer >= 1"),
    (dict(max_len=2.5), "max_len must be an integer"),
    (dict(n_tokens=8, max_len=7), "exact enumeration allows at most"),
])
def test_language_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sq.Language(**kwargs)


def test_check_language_rejects_other_objects():
    with pytest.raises(ValueError, match="lang must be"):
        sq.prefix_tree("default")
