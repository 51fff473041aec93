defmodule MixSample do
  @moduledoc "Runs one job at start, prints the result and stops the node."
  use Application

  def start(_type, _args) do
    pid = spawn(fn ->
      result = :erlcuda.launch_sync(:vector_add, [[1.0, 2.0], [3.0, 4.0]])
      IO.puts("mix_sample: vector_add -> #{inspect(result)}")
      System.stop(0)
    end)
    {:ok, pid}
  end
end
