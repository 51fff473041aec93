defmodule Erlcuda.Buffer do
  @moduledoc """
  A vector that stays on a device.

  Made by `Erlcuda.upload/2`, `Erlcuda.zeros/3`, `Erlcuda.empty/3`, `Erlcuda.transfer/3`
  and any launch or run with `keep: true`; any kernel takes one wherever it takes a vector,
  and `Erlcuda.download/2` reads one back. It belongs to the process that made it and is
  freed when that process exits, or by `Erlcuda.free/1`; `Erlcuda.give/2` hands it on.

  Its fields say where it is and what it holds: `node`, `device`, `type` (`:f32`, `:f64`,
  `:i32`, `:u32`, `:i64` or `:u8`) and `elements`. It prints as

      #Erlcuda.Buffer<f32[3], device: 0, node: :nonode@nohost>

  The struct carries the Erlang API's buffer term as the application made it; `Erlcuda`
  converts at the boundary, so a buffer goes to `:erlcuda` and comes back from it without
  any code of yours building one. Build none by hand: a struct that no call of the
  application answered names no buffer. `from_erlang/1` and `to_erlang/1` are for code
  that meets both APIs (a message of `:erlcuda.launch/3` received by hand, say).
  """

  @enforce_keys [:node, :device, :type, :elements, :term]
  defstruct @enforce_keys

  @typedoc """
  A device buffer; `term` is the Erlang API's own buffer (its opaque `:erlcuda.buffer()`),
  read by nothing else.
  """
  @type t :: %__MODULE__{
          node: node(),
          device: non_neg_integer(),
          type: :f32 | :f64 | :i32 | :u32 | :i64 | :u8,
          elements: non_neg_integer(),
          term: term()
        }

  @doc "Whether `term` is a buffer of the Erlang API."
  @spec erlang?(term()) :: boolean()
  def erlang?(term), do: :erlcuda_buffers.is_buffer(term)

  @doc "The struct of a buffer that the Erlang API answered."
  @spec from_erlang(term()) :: t()
  def from_erlang(term) do
    erlang?(term) || raise ArgumentError, "not a buffer of the Erlang API: #{inspect(term)}"
    # The layout the Erlang API documents for its buffer() type.
    {:erlcuda_buffer, node, _epoch, device, _id, type, elements} = term
    %__MODULE__{node: node, device: device, type: type, elements: elements, term: term}
  end

  @doc "The Erlang API's buffer, as `:erlcuda` takes it."
  @spec to_erlang(t()) :: term()
  def to_erlang(%__MODULE__{term: term}), do: term
end

defimpl Inspect, for: Erlcuda.Buffer do
  import Inspect.Algebra

  def inspect(%Erlcuda.Buffer{} = buffer, opts) do
    concat([
      "#Erlcuda.Buffer<",
      "#{buffer.type}[#{buffer.elements}], device: #{buffer.device}, node: ",
      to_doc(buffer.node, opts),
      ">"
    ])
  end
end
