"""Masks: one convention (bool, True = may attend) in the oracle, PyTorch and Keras, and the converters."""

import keras
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from keras import ops

import companion.keras.masking as keras_masking
import companion.torch.masking as torch_masking
from companion import reference

IDS = np.array([[5, 7, 0, 0], [0, 3, 4, 2]])


def test_reference_padding_mask_marks_real_tokens():
    mask = reference.padding_mask(IDS)
    assert mask.shape == (2, 1, 1, 4) and mask.dtype == bool
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [False, True, True, True]]
    assert reference.padding_mask(np.array([[9, 9]]), pad_id=9).sum() == 0


def test_reference_causal_mask_is_lower_triangle():
    mask = reference.causal_mask(3)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_reference_combine_masks_broadcasts_and_skips_none():
    combined = reference.combine_masks(reference.padding_mask(IDS), None, reference.causal_mask(4))
    assert combined.shape == (2, 1, 4, 4)
    # Query 3 of sentence 0 sees keys 0, 1 (2 and 3 are padding); query 0 of sentence 1 sees nothing.
    assert combined[0, 0, 3].tolist() == [True, True, False, False]
    assert not combined[1, 0, 0].any()
    assert reference.combine_masks(None, None) is None
    np.testing.assert_array_equal(reference.combine_masks(reference.causal_mask(2)), reference.causal_mask(2))


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_frameworks_match_reference(framework):
    if framework == "torch":
        m, ids, to_numpy = torch_masking, torch.from_numpy(IDS), lambda x: x.numpy()
    else:
        m, ids, to_numpy = keras_masking, IDS, ops.convert_to_numpy
    for pad_id in (0, 2):
        padding = m.padding_mask(ids, pad_id)
        assert tuple(padding.shape) == (2, 1, 1, 4)
        np.testing.assert_array_equal(to_numpy(padding), reference.padding_mask(IDS, pad_id))
    causal = m.causal_mask(4)
    assert tuple(causal.shape) == (1, 1, 4, 4)
    np.testing.assert_array_equal(to_numpy(causal), reference.causal_mask(4))
    combined = m.combine_masks(None, m.padding_mask(ids), m.causal_mask(4))
    expected = reference.combine_masks(reference.padding_mask(IDS), reference.causal_mask(4))
    np.testing.assert_array_equal(to_numpy(combined), expected)
    assert m.combine_masks(None, None) is None
    assert m.combine_masks() is None


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_padding_mask_rejects_wrong_rank(framework):
    m = torch_masking if framework == "torch" else keras_masking
    ids = torch.zeros(2, 3, 4, dtype=torch.long) if framework == "torch" else np.zeros((2, 3, 4), dtype=int)
    with pytest.raises(ValueError, match=r"ids must have shape \(batch, key_len\)"):
        m.padding_mask(ids)


def test_torch_mha_convention_is_the_negation():
    # torch.nn.MultiheadAttention: True = blocked. F.scaled_dot_product_attention: True = may attend, like ours.
    mask = reference.combine_masks(reference.padding_mask(IDS[:1]), reference.causal_mask(4))
    converted = torch_masking.to_torch_mha_mask(torch.from_numpy(mask))
    np.testing.assert_array_equal(converted.numpy(), ~mask)


def test_additive_mask_gives_the_same_attention_as_the_boolean_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    mask = torch.from_numpy(reference.combine_masks(reference.padding_mask(IDS[:1]), reference.causal_mask(4)))
    additive = torch_masking.to_additive_mask(mask, torch.float32)
    assert additive.dtype == torch.float32 and additive[~mask].eq(torch.finfo(torch.float32).min).all()
    assert additive[mask].eq(0).all()
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=additive), F.scaled_dot_product_attention(q, k, v, mask)
    )
    keras_additive = ops.convert_to_numpy(keras_masking.to_additive_mask(mask.numpy(), "float16"))
    assert keras_additive.dtype == np.float16
    np.testing.assert_array_equal(keras_additive, torch_masking.to_additive_mask(mask, torch.float16).numpy())


def test_keras_mha_mask_drops_the_head_axis():
    mask = reference.combine_masks(reference.padding_mask(IDS), reference.causal_mask(4))
    converted = ops.convert_to_numpy(keras_masking.to_keras_mha_mask(mask))
    assert converted.shape == (2, 4, 4)
    np.testing.assert_array_equal(converted, mask[:, 0])


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("float16", -65504.0), ("bfloat16", -3.3895313892515355e38), ("float32", -3.4028234663852886e38)],
)
def test_most_negative_matches_torch_finfo(dtype, expected):
    assert keras_masking.most_negative(dtype) == expected == torch.finfo(getattr(torch, dtype)).min
    assert torch_masking.most_negative(getattr(torch, dtype)) == expected  # the same name in both frameworks


def test_causal_mask_takes_a_device_in_both_frameworks():
    on_cpu_torch = torch_masking.causal_mask(4, device="cpu")
    on_cpu_keras = keras_masking.causal_mask(4, device="cpu:0")
    assert on_cpu_torch.device.type == "cpu" and "CPU" in str(on_cpu_keras.device).upper()
    np.testing.assert_array_equal(on_cpu_torch.numpy(), reference.causal_mask(4))
    np.testing.assert_array_equal(ops.convert_to_numpy(on_cpu_keras), reference.causal_mask(4))


def test_minus_1e9_overflows_in_float16():
    # Why the package never adds -1e9: in float16 it is -inf, and a row of -inf has no softmax.
    assert torch.tensor(-1e9, dtype=torch.float16).isinf()
    assert np.isinf(ops.convert_to_numpy(ops.cast(-1e9, "float16")))
    assert keras.backend.standardize_dtype(keras_masking.padding_mask(IDS).dtype) == "bool"
