# erlcuda from Elixir: `elixir -pa _build/default/lib/erlcuda/ebin test/elixir/erlcuda_test.exs`
ExUnit.start()

defmodule ErlcudaElixirTest do
  use ExUnit.Case

  setup_all do
    Application.load(:erlcuda)
    Application.put_env(:erlcuda, :backend, :cpu)
    {:ok, _} = Application.ensure_all_started(:erlcuda)
    on_exit(fn -> Application.stop(:erlcuda) end)
  end

  test "the four kernels" do
    assert {:ok, [4.0, 6.0]} = :erlcuda.launch_sync(:vector_add, [[1.0, 2.0], [3.0, 4.0]])
    assert {:ok, 6.0} = :erlcuda.launch_sync(:reduce, [[1, 2, 3]])
    assert {:ok, 11.0} = :erlcuda.launch_sync(:dot_product, [[1.0, 2.0], [3.0, 4.0]])

    assert {:ok, [19.0, 22.0, 43.0, 50.0]} =
             :erlcuda.launch_sync(:matmul, [[1, 2, 3, 4], [5, 6, 7, 8], 2, 2, 2])
  end

  test "async launch and binaries" do
    a = for x <- [1.0, 2.0, 3.0], into: <<>>, do: <<x::float-little-32>>
    {:ok, id} = :erlcuda.launch(:vector_add, [a, a], format: :binary)
    assert_receive {:erlcuda, ^id, {:ok, <<2.0::float-little-32, 4.0::float-little-32,
                                           6.0::float-little-32>>}}, 5000
  end

  test "bad input is an error tuple" do
    assert {:error, {:bad_args, _}} = :erlcuda.launch_sync(:vector_add, [[1.0], [1.0, 2.0]])
    assert {:error, {:unknown_kernel, :fft}} = :erlcuda.launch_sync(:fft, [[1.0]])
    assert {:error, {:bad_device, 9}} = :erlcuda.launch_sync(:reduce, [[1.0]], device: 9)
  end

  # The README's Elixir examples, as written: a ```elixir block right after a line
  # `<!-- example: Name -->`; each raises (a failed match) where it does not hold.
  readme = Path.join(__DIR__, "../../README.md") |> File.read!()

  examples =
    Regex.scan(~r/<!-- example: (\S+) -->\n```elixir\n(.*?)\n```/s, readme,
      capture: :all_but_first)

  test "the README has Elixir examples" do
    assert unquote(length(examples)) >= 1
  end

  for [name, code] <- examples do
    test "README example #{name}" do
      task = Task.async(fn -> Code.eval_string(unquote(code)) end)
      assert {_, _} = Task.await(task, 60_000)
    end
  end

  test "info" do
    assert %{backend: :cpu, devices: 1, worker_os_pid: pid} = :erlcuda.info()
    assert is_integer(pid)
  end
end
