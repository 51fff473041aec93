"""The Erlang module written from contract.json (``erlcuda_contract``) answers what the JSON
file declares: each element type's size, wire index and range, the limits and the log
levels."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from erlcuda import contract

ERL_TABLES = r"""
[Module] = init:get_plain_arguments(),
{ok, erlcuda_contract, Bin} = compile:file(Module, [binary, report]),
{module, _} = code:load_binary(erlcuda_contract, Module, Bin),
Range = fun(T) -> case erlcuda_contract:element_range(T) of
                      {Min, Max} -> [Min, Max];
                      float -> float
                  end end,
Types = [#{name => T, size => erlcuda_contract:element_size(T),
           index => erlcuda_contract:element_index(T),
           back => erlcuda_contract:element_type(erlcuda_contract:element_index(T)),
           range => Range(T)} || T <- erlcuda_contract:element_types()],
Show = fun(#{name := N, size := S, index := I, back := B, range := R}) ->
           io_lib:format("{\"name\": \"~s\", \"size\": ~b, \"index\": ~b, \"back\": \"~s\", "
                         "\"range\": ~s}",
                         [N, S, I, B, case R of float -> "\"float\"";
                                                [Lo, Hi] -> io_lib:format("[~b, ~b]", [Lo, Hi])
                                      end])
       end,
Past = length(Types),
io:format("{\"types\": [~s], \"past\": \"~s\", \"shm_parts\": ~b, \"kernel_name_bytes\": ~b, "
          "\"log_levels\": [~s]}~n",
          [lists:join(", ", [Show(T) || T <- Types]), erlcuda_contract:element_type(Past),
           erlcuda_contract:shm_parts(), erlcuda_contract:kernel_name_bytes(),
           lists:join(", ", [["\"", atom_to_list(L), "\""]
                             || L <- erlcuda_contract:log_levels()])]),
halt().
"""


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if shutil.which("erl") is None:
        pytest.skip("erl is not on PATH")
    module = tmp_path_factory.mktemp("contract") / "erlcuda_contract.erl"
    module.write_text(contract.erlang_module())
    proc = subprocess.run(["erl", "-noshell", "-eval", ERL_TABLES, "-extra", str(module)],
                          capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def test_element_tables_agree_with_the_json(tables: dict) -> None:
    raw = json.loads(contract.SOURCE.read_text(encoding="utf-8"))
    info = raw["element_info"]
    assert [t["name"] for t in tables["types"]] == raw["element_types"]
    for index, t in enumerate(tables["types"]):
        declared = info[t["name"]]
        assert t["size"] == declared["size"]
        assert t["index"] == index
        assert t["back"] == t["name"]
        if declared["kind"] == "int":
            assert t["range"] == [declared["min"], declared["max"]]
        else:
            assert t["range"] == "float"
    assert tables["past"] == "error"


def test_limits_agree_with_the_json(tables: dict) -> None:
    raw = json.loads(Path(contract.SOURCE).read_text(encoding="utf-8"))
    assert tables["shm_parts"] == raw["limits"]["shm_parts"]
    assert tables["kernel_name_bytes"] == raw["limits"]["kernel_name_bytes"]
    assert tables["log_levels"] == raw["log_levels"]
