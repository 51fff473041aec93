# The Elixir tests: `make test-elixir`, which runs
#   elixir -pa _build/default/lib/erlcuda/ebin -r test/elixir/test_helper.exs \
#          -r "test/elixir/*_test.exs"
# on the compiled application (its Elixir modules are built where elixirc is installed).
ExUnit.start()

defmodule ErlcudaTestApp do
  @moduledoc """
  Starts erlcuda on the cpu backend for a test module (in its setup_all), with the
  application env given, and stops and unloads it after, so that the next module starts
  from the .app's env.
  """

  def start(env \\ []) do
    Application.load(:erlcuda)
    for {key, value} <- [backend: :cpu] ++ env, do: Application.put_env(:erlcuda, key, value)
    {:ok, _} = Application.ensure_all_started(:erlcuda)

    ExUnit.Callbacks.on_exit(fn ->
      :ok = Application.stop(:erlcuda)
      :ok = Application.unload(:erlcuda)
    end)

    :ok
  end
end
