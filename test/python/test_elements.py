"""The element tables come from contract.json, and agree with numpy and C."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from erlcuda import contract, elements, kernels, shm, usercode

RAW = json.loads(contract.SOURCE.read_text())


def test_every_element_type_of_the_contract_is_described() -> None:
    assert tuple(elements.ELEMENTS) == contract.ELEMENT_TYPES == tuple(RAW["element_info"])


@pytest.mark.parametrize("name", contract.ELEMENT_TYPES)
def test_an_element_type_is_the_same_to_numpy_struct_and_its_range(name: str) -> None:
    element = elements.ELEMENTS[name]
    assert element.dtype.itemsize == element.size == struct.calcsize("<" + element.struct)
    assert kernels.DTYPES[name] == element.dtype
    assert usercode.C_TYPES[name] == RAW["element_info"][name]["c_type"]
    if element.kind == "int":
        info = np.iinfo(element.dtype)
        assert (element.low, element.high) == (info.min, info.max)
        assert elements.in_range(name, info.max) and not elements.in_range(name, info.max + 1)
        assert not elements.in_range(name, info.min - 1)
    else:
        assert element.dtype.kind == "f" and elements.in_range(name, 1 << 70)


def test_the_limits_are_the_contracts() -> None:
    assert shm.MAX_PARTS == elements.SHM_PARTS == RAW["limits"]["shm_parts"]
    assert usercode.MAX_NAME == elements.KERNEL_NAME_BYTES == RAW["limits"]["kernel_name_bytes"]
