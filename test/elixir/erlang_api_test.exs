# The Erlang API (:erlcuda) called from Elixir as it is: keyword options, binaries, tuples.
defmodule ErlangApiTest do
  use ExUnit.Case

  setup_all do
    ErlcudaTestApp.start()
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

    assert_receive {:erlcuda, ^id,
                    {:ok, <<2.0::float-little-32, 4.0::float-little-32, 6.0::float-little-32>>}},
                   5000
  end

  test "bad input is an error tuple" do
    assert {:error, {:bad_args, _}} = :erlcuda.launch_sync(:vector_add, [[1.0], [1.0, 2.0]])
    assert {:error, {:unknown_kernel, :fft}} = :erlcuda.launch_sync(:fft, [[1.0]])
    assert {:error, {:bad_device, 9}} = :erlcuda.launch_sync(:reduce, [[1.0]], device: 9)
  end

  test "info" do
    assert %{backend: :cpu, devices: 1, worker_os_pid: pid} = :erlcuda.info()
    assert is_integer(pid)
  end
end
