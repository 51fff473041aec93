defmodule MixSample do
  @moduledoc """
  Runs jobs at start through erlcuda's Elixir face (Erlcuda, built into erlcuda's ebin by
  its rebar3 build), prints the results and stops the node.
  """
  use Application

  def start(_type, _args) do
    pid =
      spawn(fn ->
        result = Erlcuda.launch_sync(:vector_add, [[1.0, 2.0], [3.0, 4.0]])
        buffer = Erlcuda.upload!([1.0, 2.0], type: :f64)
        error = Erlcuda.Error.message(%Erlcuda.Error{reason: {:bad_device, 9}})

        IO.puts(
          "mix_sample: vector_add -> #{inspect(result)}, upload -> #{inspect(buffer)}, " <>
            "#{Erlcuda.download!(buffer) |> inspect()}; #{error}"
        )

        System.stop(0)
      end)

    {:ok, pid}
  end
end
