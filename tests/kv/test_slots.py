"""grammarspec.kv.slots.SlotLayer's keys and values: views of the cached columns, storage when assigned."""

from __future__ import annotations

import torch

from grammarspec.kv.slots import SlotLayer


def test_keys_and_values_read_the_cached_columns_of_their_storage():
    layer = SlotLayer()
    assert layer.keys is None and layer.values is None and layer.get_seq_length() == 0
    keys, values = torch.randn(3, 2, 6, 4), torch.randn(3, 2, 6, 5)
    layer.keys, layer.values = keys, values  # adopted as the storage: 3 rows of 6 columns
    assert (layer.rows, layer.seq) == (3, 6) and layer.data_ptr() == keys.data_ptr()
    layer.crop(-2)
    assert torch.equal(layer.keys, keys[:, :, :4]) and torch.equal(layer.values, values[:, :, :4])
    assert layer.keys.data_ptr() == keys.data_ptr()  # a view, not a copy
    layer.values = torch.zeros(3, 2, 6, 5)  # values take the storage only; the length stays the keys'
    assert layer.values.shape == (3, 2, 4, 5) and layer.seq == 4
    layer.reset()
    assert layer.keys is None and layer.values is None
