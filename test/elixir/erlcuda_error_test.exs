# Erlcuda.Error: the reason as the Erlang API gives it, and a message in words for each
# reason of its reason() type.
defmodule ErlcudaErrorTest do
  use ExUnit.Case, async: true

  doctest Erlcuda.Error

  defp message(reason), do: Exception.message(%Erlcuda.Error{reason: reason})

  test "raise takes the reason, and the stamps of a traced call" do
    error = assert_raise Erlcuda.Error, fn -> raise Erlcuda.Error, reason: :timeout end
    assert error.reason == :timeout
    assert error.stamps == nil

    error =
      assert_raise Erlcuda.Error, fn ->
        raise Erlcuda.Error, reason: :overloaded, stamps: %{"queue" => 5}
      end

    assert error.stamps == %{"queue" => 5}
  end

  test "every reason of the Erlang API reads as words" do
    cases = [
      {{:unknown_kernel, :fft},
       "unknown kernel :fft (Erlcuda.kernels/0 lists those a launch may name)"},
      {{:bad_device, 9}, "no device 9 (a device is an index from 0, or :any)"},
      {{:bad_args, "length mismatch"}, "bad arguments: length mismatch"},
      {{:bad_option, {:colour, :red}}, "bad option: {:colour, :red}"},
      {:timeout, "no reply within the timeout"},
      {:overloaded,
       "the device's queue is full (overloaded); the option wait: ms waits for room"},
      {:too_large, "the launch is larger than the wire takes (too_large)"},
      {{:worker_down, :killed}, "the worker went down: :killed"},
      {{:bad_python, "python3: no numpy"},
       "the configured Python cannot run the worker: python3: no numpy"},
      {{:backend_unavailable, "no GPU"}, "backend unavailable: no GPU"},
      {{:cuda, :out_of_memory, "2 GiB"}, "CUDA error :out_of_memory: 2 GiB"},
      {{:non_finite, "inf"}, "non-finite result: inf"},
      {{:bad_node, :n@h}, ":n@h is not a node of the cluster"},
      {{:node_down, :n@h}, "node :n@h went down or was disconnected"},
      {:not_owner, "only the buffer's owner may do that (not_owner)"},
      {{:compile, "kernel.cu:1: error"},
       "the kernel's source did not compile:\nkernel.cu:1: error"},
      {{:already_loaded, :vector_add},
       ":vector_add is already a kernel (of another module, or a built-in one)"},
      {{:bad_program, "a program needs a step"}, "bad program: a program needs a step"},
      {{:internal, "oops"}, "internal error in erlcuda: oops"}
    ]

    for {reason, text} <- cases, do: assert(message(reason) == text)
  end

  test "a step's reason reads as the step and its own reason, nested or not" do
    assert message({:step, 3, {:bad_args, "length mismatch"}}) ==
             "step 3 of the program: bad arguments: length mismatch"

    assert message({:step, 1, :timeout}) == "step 1 of the program: no reply within the timeout"
  end

  test "buffers in a reason print as buffers" do
    buffer = %Erlcuda.Buffer{node: :n@h, device: 1, type: :f32, elements: 4, term: nil}
    printed = "#Erlcuda.Buffer<f32[4], device: 1, node: :n@h>"

    assert message({:buffer_lost, buffer}) ==
             "buffer lost (freed, or gone with a worker that restarted): " <> printed

    assert message({:wrong_device, buffer}) == printed <> " is on another device than the launch"
    assert message({:remote_buffer, buffer}) == printed <> " is a buffer of another node"
  end

  test "a reason it does not know, or text that is not a binary, is printed as a term" do
    assert message({:something, :new}) == "{:something, :new}"
    assert message({:bad_args, [1, 2]}) == "bad arguments: [1, 2]"
  end
end
