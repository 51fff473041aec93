defmodule Erlcuda.Error do
  @moduledoc """
  Raised by the bang variants of `Erlcuda` (`launch_sync!/3`, `upload!/2`, ...) where the
  plain function answers `{:error, reason}`.

  `reason` is that term, exactly (buffers in it as `Erlcuda.Buffer` structs); `stamps` is
  the worker's time stamps of a launch made with `trace: true`, else `nil`. The message
  says in words what the reason says:

      iex> Erlcuda.Error.message(%Erlcuda.Error{reason: {:step, 2, {:bad_device, 7}}})
      "step 2 of the program: no device 7 (a device is an index from 0, or :any)"

  The reasons, as the Erlang API's `reason()` type lists them:

  | reason | means |
  |---|---|
  | `{:unknown_kernel, name}` | no built-in or loaded kernel of that name |
  | `{:bad_device, device}` | no such device on the node |
  | `{:bad_args, text}` | arguments the kernel cannot take; `text` says why |
  | `{:bad_option, option}` | an option that is not known or not valid |
  | `:timeout` | no reply within the timeout |
  | `:overloaded` | the device's queue is full (`wait: ms` waits for room) |
  | `:too_large` | a launch larger than the wire takes |
  | `{:worker_down, why}` | the worker process went down while the job was in it |
  | `{:bad_python, text}` | the configured Python cannot run the worker |
  | `{:backend_unavailable, text}` | the backend cannot run this (no GPU, no compiler, ...) |
  | `{:cuda, code, text}` | a CUDA error (`Erlcuda.error_codes/0`) |
  | `{:non_finite, text}` | a result with an infinity or a NaN where a number was due |
  | `{:buffer_lost, buffer}` | a buffer freed, or lost with a worker that restarted |
  | `{:wrong_device, buffer}` | a buffer on another device than the launch's |
  | `{:remote_buffer, buffer}` | a buffer of another node where only this node's is taken |
  | `{:bad_node, node}` | not a node of the cluster |
  | `{:node_down, node}` | the node went down, or its connection dropped |
  | `:not_owner` | only the buffer's owner may do that |
  | `{:compile, log}` | the kernel's source did not compile; `log` is the compiler's |
  | `{:already_loaded, name}` | a kernel name of another module or a built-in one |
  | `{:bad_program, text}` | a program spec that cannot run; `text` says why |
  | `{:step, index, reason}` | a program's step (from 1) refused the run's inputs |
  | `{:internal, text}` | a fault of erlcuda's own |
  """

  defexception [:reason, stamps: nil]

  @type t :: %__MODULE__{reason: term(), stamps: %{binary() => non_neg_integer()} | nil}

  @impl true
  def message(%__MODULE__{reason: reason}), do: describe(reason)

  defp describe({:unknown_kernel, name}),
    do: "unknown kernel #{inspect(name)} (Erlcuda.kernels/0 lists those a launch may name)"

  defp describe({:bad_device, device}),
    do: "no device #{inspect(device)} (a device is an index from 0, or :any)"

  defp describe({:bad_args, text}), do: "bad arguments: #{text(text)}"
  defp describe({:bad_option, option}), do: "bad option: #{inspect(option)}"
  defp describe(:timeout), do: "no reply within the timeout"

  defp describe(:overloaded),
    do: "the device's queue is full (overloaded); the option wait: ms waits for room"

  defp describe(:too_large), do: "the launch is larger than the wire takes (too_large)"
  defp describe({:worker_down, why}), do: "the worker went down: #{inspect(why)}"

  defp describe({:bad_python, text}),
    do: "the configured Python cannot run the worker: #{text(text)}"

  defp describe({:backend_unavailable, text}), do: "backend unavailable: #{text(text)}"
  defp describe({:cuda, code, text}), do: "CUDA error #{inspect(code)}: #{text(text)}"
  defp describe({:non_finite, text}), do: "non-finite result: #{text(text)}"

  defp describe({:buffer_lost, buffer}),
    do: "buffer lost (freed, or gone with a worker that restarted): #{inspect(buffer)}"

  defp describe({:wrong_device, buffer}),
    do: "#{inspect(buffer)} is on another device than the launch"

  defp describe({:remote_buffer, buffer}),
    do: "#{inspect(buffer)} is a buffer of another node"

  defp describe({:bad_node, node}), do: "#{inspect(node)} is not a node of the cluster"
  defp describe({:node_down, node}), do: "node #{inspect(node)} went down or was disconnected"
  defp describe(:not_owner), do: "only the buffer's owner may do that (not_owner)"
  defp describe({:compile, log}), do: "the kernel's source did not compile:\n#{text(log)}"

  defp describe({:already_loaded, name}),
    do: "#{inspect(name)} is already a kernel (of another module, or a built-in one)"

  defp describe({:bad_program, text}), do: "bad program: #{text(text)}"

  defp describe({:step, index, reason}),
    do: "step #{index} of the program: #{describe(reason)}"

  defp describe({:internal, text}), do: "internal error in erlcuda: #{text(text)}"
  defp describe(other), do: inspect(other)

  defp text(text) when is_binary(text), do: text
  defp text(other), do: inspect(other)
end
