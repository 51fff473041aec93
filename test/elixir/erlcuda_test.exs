# Erlcuda, the Elixir face of the API, on the cpu backend with two virtual devices: every
# function and its bang variant, buffers and programs as structs at the boundary, and
# binaries in and out.
defmodule ErlcudaTest do
  use ExUnit.Case

  alias Erlcuda.{Buffer, Program}

  setup_all do
    ErlcudaTestApp.start(cpu_devices: 2)
  end

  doctest Erlcuda

  # A process that frees the buffers it is sent, answering what free/1 answered.
  defp free_on_demand(to) do
    receive do
      {:free, buffer} ->
        send(to, {:freed, Erlcuda.free(buffer)})
        free_on_demand(to)
    end
  end

  defp f32(values), do: for(x <- values, into: <<>>, do: <<x::float-little-32>>)

  defp chain_spec do
    %{
      name: :chain,
      inputs: [:a, :b],
      steps: [{:s, :vector_add, [:a, :b]}, {:t, :reduce, [:s]}],
      outputs: [:t, :s]
    }
  end

  describe "launches" do
    test "launch/3 answers a job id at once, await/2 its result" do
      assert {:ok, id} = Erlcuda.launch(:vector_add, [[1.0, 2.0], [3.0, 4.0]])
      assert is_integer(id)
      assert Erlcuda.await(id, 5000) == {:ok, [4.0, 6.0]}
      assert {:ok, id} = Erlcuda.launch(:reduce, [f32([1.0, 2.0])], type: :f32)
      assert Erlcuda.await(id) == {:ok, 3.0}
    end

    test "launch/3 and await/2 answer errors as the Erlang API does" do
      assert Erlcuda.launch(:fft, [[1.0]]) == {:error, {:unknown_kernel, :fft}}
      assert Erlcuda.launch(:reduce, [[1.0]], device: 9) == {:error, {:bad_device, 9}}
      # an id this process never launched waits for the whole timeout
      assert Erlcuda.await(987_654_321, 0) == {:error, :timeout}
      assert Erlcuda.await(1, -1) == {:error, {:bad_option, {:timeout, -1}}}
    end

    test "launch!/3 and await!/2 answer the value or raise Erlcuda.Error" do
      id = Erlcuda.launch!(:dot_product, [[1.0, 2.0], [3.0, 4.0]], device: 1)
      assert Erlcuda.await!(id) == 11.0

      error = assert_raise Erlcuda.Error, fn -> Erlcuda.launch!(:fft, [[1.0]]) end
      assert error.reason == {:unknown_kernel, :fft}
      assert error.stamps == nil
      assert Exception.message(error) =~ "unknown kernel :fft"

      error = assert_raise Erlcuda.Error, fn -> Erlcuda.await!(987_654_321, 0) end
      assert error.reason == :timeout
    end

    test "a kept result comes back as a buffer, through await/2 or from_erlang/1" do
      {:ok, id} = Erlcuda.launch(:vector_add, [[1.0, 2.0], [3.0, 4.0]], keep: true)
      assert {:ok, %Buffer{type: :f32, elements: 2, device: 0} = sum} = Erlcuda.await(id)
      assert Erlcuda.download!(sum) == [4.0, 6.0]

      # a reply received by hand carries the Erlang API's terms
      {:ok, id} = Erlcuda.launch(:vector_add, [sum, sum], keep: true)
      assert_receive {:erlcuda, ^id, {:ok, raw}}, 5000
      refute is_struct(raw)
      assert {:ok, %Buffer{elements: 2} = twice} = Erlcuda.from_erlang({:ok, raw})
      assert Erlcuda.to_erlang(twice) == raw
      assert :erlcuda.download(raw) == {:ok, [8.0, 12.0]}
      :ok = Erlcuda.free(twice)
      :ok = Erlcuda.free(sum)
    end

    test "launch_sync/3 answers the result, or the error as the Erlang API does" do
      assert Erlcuda.launch_sync(:vector_add, [[1.0, 2.0], [3.0, 4.0]]) == {:ok, [4.0, 6.0]}

      assert Erlcuda.launch_sync(:matmul, [[1, 2, 3, 4], [5, 6, 7, 8], 2, 2, 2], device: 1) ==
               {:ok, [19.0, 22.0, 43.0, 50.0]}

      assert {:error, {:bad_args, "length mismatch" <> _}} =
               Erlcuda.launch_sync(:vector_add, [[1.0], [1.0, 2.0]])

      assert {:error, {:bad_option, _}} = Erlcuda.launch_sync(:reduce, [[1.0]], colour: :red)

      # options may be a map too
      assert Erlcuda.launch_sync(:reduce, [[1.0, 2.0]], %{device: 1, type: :f64}) == {:ok, 3.0}
    end

    test "launch_sync/3 with trace: true answers the stamps beside the value or the reason" do
      assert {:ok, 3.0, %{"backend" => backend}} =
               Erlcuda.launch_sync(:reduce, [[1.0, 2.0]], trace: true)

      assert is_integer(backend)

      assert {:error, {:non_finite, _}, %{}} =
               Erlcuda.launch_sync(:vector_add, [[3.0e38], [3.0e38]], trace: true)
    end

    test "launch_sync!/3 answers the value, {value, stamps} when traced, or raises" do
      assert Erlcuda.launch_sync!(:vector_add, [[1.0], [2.0]]) == [3.0]
      assert {3.0, %{"backend" => _}} = Erlcuda.launch_sync!(:reduce, [[1.0, 2.0]], trace: true)

      error =
        assert_raise Erlcuda.Error, ~r/^bad arguments: length mismatch/, fn ->
          Erlcuda.launch_sync!(:vector_add, [[1.0], [1.0, 2.0]])
        end

      assert {:bad_args, _} = error.reason

      error =
        assert_raise Erlcuda.Error, fn ->
          Erlcuda.launch_sync!(:vector_add, [[3.0e38], [3.0e38]], trace: true)
        end

      assert {:non_finite, _} = error.reason
      assert %{"backend" => _} = error.stamps
    end

    test "info/0,1, kernels/0 and error_codes/0 answer the Erlang API's values" do
      assert %{backend: :cpu, devices: 2, worker_os_pid: pid} = Erlcuda.info()
      assert is_integer(pid)
      assert %{} = cluster = Erlcuda.info(:cluster)
      assert %{devices: 2, backend: :cpu} = cluster[node()]
      assert {:error, {:bad_args, _}} = Erlcuda.info(:bogus)
      assert Enum.any?(Erlcuda.kernels(), &(&1.name == :vector_add))
      assert Erlcuda.kernels() == :erlcuda.kernels()
      assert :out_of_memory in Erlcuda.error_codes()
    end
  end

  describe "buffers" do
    test "upload/2, download/2, free/1 and their bang variants" do
      assert {:ok, %Buffer{node: node, device: 1, type: :f64, elements: 3} = b} =
               Erlcuda.upload([1.0, 2.0, 3.0], type: :f64, device: 1)

      assert node == node()
      assert Erlcuda.download(b) == {:ok, [1.0, 2.0, 3.0]}

      assert Erlcuda.download(b, format: :binary) ==
               {:ok, <<1.0::float-little-64, 2.0::float-little-64, 3.0::float-little-64>>}

      assert Erlcuda.launch_sync!(:vector_add, [b, b]) == [2.0, 4.0, 6.0]
      assert Erlcuda.free(b) == :ok
      # freed: a launch on it is buffer_lost, with the buffer as a struct
      assert Erlcuda.launch_sync(:reduce, [b]) == {:error, {:buffer_lost, b}}
      assert Erlcuda.free(b) == :ok

      b = Erlcuda.upload!(f32([5.0]))
      assert %Buffer{type: :f32, elements: 1, device: 0} = b
      assert Erlcuda.download!(b) == [5.0]
      assert Erlcuda.free!(b) == :ok
      assert Erlcuda.download(b) == {:error, {:buffer_lost, b}}

      error = assert_raise Erlcuda.Error, fn -> Erlcuda.download!(b) end
      assert error.reason == {:buffer_lost, b}
      assert Exception.message(error) =~ "#Erlcuda.Buffer<f32[1], device: 0"
      assert_raise Erlcuda.Error, fn -> Erlcuda.upload!([1.0], type: :f99) end
      assert {:error, {:bad_args, _}} = Erlcuda.download(:not_a_buffer)
      assert {:error, {:bad_args, _}} = Erlcuda.free(:not_a_buffer)
      assert_raise Erlcuda.Error, fn -> Erlcuda.free!(:not_a_buffer) end
    end

    test "zeros/3 and empty/3, and their bang variants" do
      assert {:ok, %Buffer{type: :i32, elements: 4} = z} = Erlcuda.zeros(:i32, 4)
      assert Erlcuda.download!(z) == [0, 0, 0, 0]
      assert %Buffer{type: :u8, elements: 3, device: 1} = z8 = Erlcuda.zeros!(:u8, 3, device: 1)
      assert Erlcuda.download!(z8, format: :binary) == <<0, 0, 0>>
      assert {:ok, %Buffer{type: :f64, elements: 5} = e} = Erlcuda.empty(:f64, 5)
      assert %Buffer{type: :u32, elements: 2} = e32 = Erlcuda.empty!(:u32, 2)
      assert byte_size(Erlcuda.download!(e, format: :binary)) == 40

      assert Erlcuda.zeros(:f99, 3) ==
               {:error, {:bad_args, "f99 is not an element type ([f32,f64,i32,u32,i64,u8])"}}

      assert_raise Erlcuda.Error, ~r/f99 is not an element type/, fn ->
        Erlcuda.empty!(:f99, 1)
      end

      for b <- [z, z8, e, e32], do: :ok = Erlcuda.free(b)
    end

    test "give/2 hands a buffer on, and only its owner may free it" do
      b = Erlcuda.upload!([1.0, 2.0])
      me = self()

      owner = spawn_link(fn -> free_on_demand(me) end)

      assert Erlcuda.give(b, owner) == :ok
      assert %{owner: ^owner, type: :f32, elements: 2, bytes: 8} = Erlcuda.buffer_info(b)
      assert Erlcuda.free(b) == {:error, :not_owner}
      error = assert_raise Erlcuda.Error, fn -> Erlcuda.free!(b) end
      assert error.reason == :not_owner
      assert Exception.message(error) =~ "owner"
      assert Erlcuda.give(b, self()) == {:error, :not_owner}
      assert_raise Erlcuda.Error, fn -> Erlcuda.give!(b, self()) end
      send(owner, {:free, b})
      assert_receive {:freed, :ok}, 5000
      assert %{owner: :undefined} = Erlcuda.buffer_info(b)

      c = Erlcuda.upload!([1.0])
      assert Erlcuda.give!(c, owner) == :ok
      assert %{owner: ^owner} = Erlcuda.buffer_info(c)
      assert {:error, {:bad_args, _}} = Erlcuda.give(c, :not_a_pid)
      send(owner, {:free, c})
      assert_receive {:freed, :ok}, 5000
      assert {:error, {:bad_args, _}} = Erlcuda.buffer_info(:not_a_buffer)
    end

    test "buffer_info/1 describes a buffer, as a map" do
      b = Erlcuda.upload!([1, 2, 3], type: :i64, device: 1)

      assert %{node: node, device: 1, type: :i64, elements: 3, bytes: 24, owner: owner} =
               Erlcuda.buffer_info(b)

      assert {node, owner} == {node(), self()}
      :ok = Erlcuda.free(b)
    end

    test "transfer/3 copies a buffer, to another device or its own, and transfer!/3" do
      b = Erlcuda.upload!([1.0, 2.0], device: 1)

      assert {:ok, %Buffer{device: 0, elements: 2, type: :f32} = c} =
               Erlcuda.transfer(b, node(), device: 0)

      assert Erlcuda.download!(c) == [1.0, 2.0]
      assert %Buffer{device: 1} = d = Erlcuda.transfer!(b, node())
      assert d != b
      assert Erlcuda.download!(d) == [1.0, 2.0]
      assert Erlcuda.transfer(b, :nosuch@nohost) == {:error, {:bad_node, :nosuch@nohost}}

      error = assert_raise Erlcuda.Error, fn -> Erlcuda.transfer!(b, :nosuch@nohost) end
      assert Exception.message(error) == ":nosuch@nohost is not a node of the cluster"
      # a buffer of another device than the launch's
      assert Erlcuda.launch_sync(:vector_add, [b, c]) == {:error, {:wrong_device, c}}
      for x <- [b, c, d], do: :ok = Erlcuda.free(x)
    end

    test "a buffer prints as its type, length, device and node" do
      b = Erlcuda.upload!([1.0, 2.0, 3.0], type: :f64, device: 1)
      assert inspect(b) == "#Erlcuda.Buffer<f64[3], device: 1, node: #{inspect(node())}>"
      assert inspect({:ok, [b]}) =~ "{:ok, [#Erlcuda.Buffer<f64[3], device: 1"
      :ok = Erlcuda.free(b)
    end

    test "a binary round trip of every element type, as Nx.to_binary/from_binary make them" do
      cases = [
        f32: for(x <- [1.5, -2.0], into: <<>>, do: <<x::float-little-32>>),
        f64: for(x <- [1.5, -2.0], into: <<>>, do: <<x::float-little-64>>),
        i32: for(x <- [-7, 2_000_000_000], into: <<>>, do: <<x::signed-little-32>>),
        u32: for(x <- [7, 4_000_000_000], into: <<>>, do: <<x::unsigned-little-32>>),
        i64: for(x <- [-7, 9_000_000_000_000], into: <<>>, do: <<x::signed-little-64>>),
        u8: <<0, 255, 7>>
      ]

      for {type, binary} <- cases do
        b = Erlcuda.upload!(binary, type: type)
        assert b.type == type
        assert Erlcuda.download!(b, format: :binary) == binary
        # a copy on the device, back as a binary of the same type
        assert Erlcuda.launch_sync!(:copy, [b], format: :binary) == binary
        :ok = Erlcuda.free(b)
      end

      assert Erlcuda.launch_sync!(:vector_add, [f32([1.0, 2.0]), f32([3.0, 4.0])], format: :binary) ==
               f32([4.0, 6.0])
    end
  end

  describe "user kernels" do
    @scale """
    extern "C" __global__ void scale(float *x, float a, long long n) {
      long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
      if (i < n) x[i] *= a;
    }
    """

    test "load/4 compiles and declares kernels, unload/1 drops them" do
      kernels = [ex_scale: [{:inout, :f32}, {:scalar, :f32}, {:scalar, :i64}]]
      source = String.replace(@scale, "void scale(", "void ex_scale(")
      assert Erlcuda.load(:ex_kernels, source, kernels) == :ok
      assert Erlcuda.launch_sync(:ex_scale, [[1.0, 2.0, 3.0], 2.0, 3]) == {:ok, [[2.0, 4.0, 6.0]]}
      assert Erlcuda.unload(:ex_kernels) == :ok

      assert Erlcuda.launch_sync(:ex_scale, [[1.0], 2.0, 1]) ==
               {:error, {:unknown_kernel, :ex_scale}}

      assert Erlcuda.unload(:ex_kernels) == :ok
    end

    test "load!/4 and unload!/1, and a compile error raised with the compiler's log" do
      source = String.replace(@scale, "void scale(", "void ex_scale2(")
      kernels = [ex_scale2: [{:inout, :f32}, {:scalar, :f32}, {:scalar, :i64}]]
      assert Erlcuda.load!(:ex_kernels2, source, kernels, timeout: 120_000) == :ok
      assert Erlcuda.launch_sync!(:ex_scale2, [[1.0], 3.0, 1]) == [[3.0]]
      assert Erlcuda.unload!(:ex_kernels2) == :ok

      assert {:error, {:compile, log}} =
               Erlcuda.load(:ex_broken, "this is not C", ex_broken: [{:in, :f32}])

      assert log =~ "error"

      error =
        assert_raise Erlcuda.Error, fn ->
          Erlcuda.load!(:ex_broken, "this is not C", ex_broken: [{:in, :f32}])
        end

      assert {:compile, ^log} = error.reason
      assert Exception.message(error) =~ "did not compile"

      assert {:error, {:bad_args, _}} = Erlcuda.unload("not an atom")
      assert_raise Erlcuda.Error, fn -> Erlcuda.unload!("not an atom") end
    end

    test "elementwise/5 and elementwise!/5 write, compile and load a kernel" do
      assert Erlcuda.elementwise(
               :ex_saxpy,
               [a: {:scalar, :f32}, x: :f32, y: :f32],
               [z: :f32],
               "z = a * x + y"
             ) == :ok

      assert Erlcuda.launch_sync(:ex_saxpy, [2.0, [1.0, 2.0], [1.0, 1.0]]) == {:ok, [3.0, 5.0]}

      assert Erlcuda.elementwise!(:ex_twice, [x: :f64], [y: :f64], "y = 2 * x", timeout: 120_000) ==
               :ok

      x = Erlcuda.upload!([1.0, 2.0], type: :f64)

      assert {:ok, %Buffer{type: :f64, elements: 2} = y} =
               Erlcuda.launch_sync(:ex_twice, [x], keep: true)

      assert Erlcuda.download!(y) == [2.0, 4.0]

      error =
        assert_raise Erlcuda.Error, fn ->
          Erlcuda.elementwise!(:vector_add, [x: :f32], [y: :f32], "y = x")
        end

      assert error.reason == {:already_loaded, :vector_add}
      for b <- [x, y], do: :ok = Erlcuda.free(b)
      :ok = Erlcuda.unload(:ex_saxpy)
      :ok = Erlcuda.unload(:ex_twice)
    end
  end

  describe "programs" do
    test "program/2 makes a program struct that prints as its signature" do
      assert {:ok, %Program{name: :chain} = p} = Erlcuda.program(chain_spec())
      assert p.inputs == [a: :vector, b: :vector]
      assert p.outputs == [:scalar, :vector]

      assert inspect(p) == "#Erlcuda.Program<chain(a: :vector, b: :vector) -> [:scalar, :vector]>"

      spec = %{
        inputs: [{:x, :f64}, :n],
        steps: [{:t, :matmul, [:x, :x, :n, :n, :n]}],
        outputs: :t
      }

      assert %Program{name: :program, outputs: :vector} = mm = Erlcuda.program!(spec, fuse: false)
      assert mm.inputs == [x: {:vector, :f64}, n: :dim]
      assert inspect(mm) == "#Erlcuda.Program<program(x: {:vector, :f64}, n: :dim) -> :vector>"
      assert Erlcuda.run_sync(mm, [[1.0, 2.0, 3.0, 4.0], 2]) == {:ok, [7.0, 10.0, 15.0, 22.0]}
    end

    test "a spec that cannot run is {:error, {:bad_program, text}}, or raises" do
      assert {:error, {:bad_program, text}} =
               Erlcuda.program(%{inputs: [:x], steps: [], outputs: :x})

      assert text == "a program needs a step"

      assert {:error, {:bad_program, _}} = Erlcuda.program(chain_spec(), colour: :red)

      error =
        assert_raise Erlcuda.Error, ~r/^bad program: /, fn ->
          Erlcuda.program!(%{inputs: [:x], steps: [{:t, :reduce, [:y]}], outputs: :t})
        end

      assert {:bad_program, _} = error.reason
    end

    test "run_sync/3 and run_sync!/3 answer the outputs; a step's refusal names its index" do
      p = Erlcuda.program!(chain_spec())
      assert Erlcuda.run_sync(p, [[1.0, 2.0], [3.0, 4.0]]) == {:ok, [10.0, [4.0, 6.0]]}
      assert Erlcuda.run_sync!(p, [f32([1.0]), f32([2.0])], format: :binary) == [3.0, f32([3.0])]

      assert {:error, {:step, 1, {:bad_args, "length mismatch" <> _}}} =
               Erlcuda.run_sync(p, [[1.0, 2.0], [1.0]])

      error =
        assert_raise Erlcuda.Error, ~r/^step 1 of the program: bad arguments: /, fn ->
          Erlcuda.run_sync!(p, [[1.0, 2.0], [1.0]])
        end

      assert {:step, 1, {:bad_args, _}} = error.reason
      assert {:error, {:bad_args, _}} = Erlcuda.run_sync(:vector_add, [[1.0], [1.0]])

      assert {[10.0, [4.0, 6.0]], %{"backend" => _}} =
               Erlcuda.run_sync!(p, [[1.0, 2.0], [3.0, 4.0]], trace: true)
    end

    test "run/3 and run!/3 answer a run id, await/2 the outputs" do
      p = Erlcuda.program!(chain_spec())
      assert {:ok, id} = Erlcuda.run(p, [[1.0], [2.0]])
      assert Erlcuda.await(id) == {:ok, [3.0, [3.0]]}
      id = Erlcuda.run!(p, [[1.0, 2.0], [2.0]])
      assert {:error, {:step, 1, _}} = Erlcuda.await(id)
      assert {:error, {:bad_device, 7}} = Erlcuda.run(p, [[1.0], [1.0]], device: 7)
      assert_raise Erlcuda.Error, fn -> Erlcuda.run!(p, [[1.0], [1.0]], device: 7) end
    end

    test "buffers in a spec, as inputs and as kept outputs" do
      a = Erlcuda.upload!([1.0, 2.0, 3.0])

      spec = %{
        inputs: [:x],
        steps: [{:t, :vector_add, [:x, a]}, {:s, :reduce, [:t]}],
        outputs: [:s, :t]
      }

      p = Erlcuda.program!(spec)
      assert Erlcuda.run_sync!(p, [[1.0, 1.0, 1.0]]) == [9.0, [2.0, 3.0, 4.0]]
      assert Erlcuda.run_sync!(p, [a]) == [12.0, [2.0, 4.0, 6.0]]

      assert [12.0, %Buffer{type: :f32, elements: 3, device: 0} = kept] =
               Erlcuda.run_sync!(p, [a], keep: true)

      assert Erlcuda.download!(kept) == [2.0, 4.0, 6.0]
      :ok = Erlcuda.free(kept)
      :ok = Erlcuda.free(a)
      # the buffer the program holds is gone: its runs say which, as a struct
      assert Erlcuda.run_sync(p, [[1.0, 1.0, 1.0]]) == {:error, {:buffer_lost, a}}
    end
  end

  describe "the boundary" do
    test "to_erlang/1 and from_erlang/1 convert buffers and programs wherever they are" do
      b = Erlcuda.upload!([1.0])
      p = Erlcuda.program!(chain_spec())
      raw_b = Buffer.to_erlang(b)
      raw_p = Program.to_erlang(p)
      assert :erlcuda_buffers.is_buffer(raw_b)
      nested = %{list: [1, b, {p, [b]}], tail: [b | b]}
      raw = %{list: [1, raw_b, {raw_p, [raw_b]}], tail: [raw_b | raw_b]}
      assert Erlcuda.to_erlang(nested) == raw
      assert Erlcuda.from_erlang(raw) == nested
      assert Buffer.from_erlang(raw_b) == b
      assert Program.from_erlang(raw_p) == p
      assert_raise ArgumentError, fn -> Buffer.from_erlang({:erlcuda_buffer, :x}) end
      assert_raise ArgumentError, fn -> Program.from_erlang(:nope) end
      # terms without either stay as they are
      vector = Enum.map(1..1000, &(&1 * 1.0))
      assert Erlcuda.from_erlang({:ok, [1.5, vector]}) == {:ok, [1.5, vector]}
      assert Erlcuda.to_erlang([vector, "bin", %{a: 1}]) == [vector, "bin", %{a: 1}]
      :ok = Erlcuda.free(b)
    end
  end
end
