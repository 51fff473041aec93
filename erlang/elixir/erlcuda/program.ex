defmodule Erlcuda.Program do
  @moduledoc """
  A program: many kernels on device data, run in one launch. Made by `Erlcuda.program/2`,
  run by `Erlcuda.run/3` and `Erlcuda.run_sync/3`.

  Its fields say what a run takes and answers: `name`, `inputs` (each input's name and
  what a run passes for it: `:vector`, `{:vector, type}` where the spec fixed the type,
  `:dim` for a count or a size, `{:scalar, type}`) and `outputs` (`:vector` or `:scalar`,
  or a list of those where the spec named a list). It prints as a signature:

      #Erlcuda.Program<chain(a: :vector, b: :vector) -> [:scalar, :vector]>

  As `Erlcuda.Buffer` does, the struct carries the Erlang API's program term and is
  converted at the boundary; build none by hand.
  """

  @enforce_keys [:name, :inputs, :outputs, :term]
  defstruct @enforce_keys

  @typedoc "What a run passes for an input."
  @type use :: :vector | {:vector, atom()} | :dim | {:scalar, atom()}

  @typedoc """
  A program; `term` is the Erlang API's own program (its opaque `:erlcuda.program()`), read
  by nothing else.
  """
  @type t :: %__MODULE__{
          name: atom(),
          inputs: [{atom(), use()}],
          outputs: :vector | :scalar | [:vector | :scalar],
          term: term()
        }

  @doc "Whether `term` is a program of the Erlang API (`:erlcuda.program/1,2` made it)."
  @spec erlang?(term()) :: boolean()
  def erlang?(term), do: :erlcuda_program.is_program(term)

  @doc "The struct of a program that the Erlang API made."
  @spec from_erlang(term()) :: t()
  def from_erlang(term) do
    erlang?(term) || raise ArgumentError, "not a program of the Erlang API: #{inspect(term)}"

    outputs =
      case :erlcuda_program.shape(term) do
        :single -> hd(:erlcuda_program.outputs(term))
        :list -> :erlcuda_program.outputs(term)
      end

    %__MODULE__{
      name: :erlcuda_program.name(term),
      inputs: :erlcuda_program.inputs(term),
      outputs: outputs,
      term: term
    }
  end

  @doc "The Erlang API's program, as `:erlcuda` takes it."
  @spec to_erlang(t()) :: term()
  def to_erlang(%__MODULE__{term: term}), do: term
end

defimpl Inspect, for: Erlcuda.Program do
  import Inspect.Algebra

  # As a signature: the name, what each input takes, what a run answers.
  def inspect(%Erlcuda.Program{} = program, opts) do
    inputs =
      container_doc("(", program.inputs, ")", opts, fn {name, use}, opts ->
        concat([Atom.to_string(name), ": ", to_doc(use, opts)])
      end)

    concat([
      "#Erlcuda.Program<",
      Atom.to_string(program.name),
      inputs,
      " -> ",
      to_doc(program.outputs, opts),
      ">"
    ])
  end
end
