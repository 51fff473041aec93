defmodule Erlcuda do
  @moduledoc """
  GPU compute from Elixir: the `:erlcuda` application's API with keyword options, buffers
  and programs as structs, and bang variants that raise `Erlcuda.Error`.

  The work runs in a separate worker OS process (CUDA through PyCUDA, or numpy on the cpu
  backend), so a crash there never takes the node down. Start the application first
  (`Application.ensure_all_started(:erlcuda)`, or list `:erlcuda` in your application's
  dependencies).

      {:ok, [4.0, 6.0]} = Erlcuda.launch_sync(:vector_add, [[1.0, 2.0], [3.0, 4.0]])
      sum = Erlcuda.launch_sync!(:reduce, [[1.0, 2.0, 3.0]])

  ## Names and answers

  Each function is the Erlang function of the same name (`launch_sync/3` is
  `:erlcuda.launch_sync/3`), so the Erlang documentation (`h :erlcuda.launch_sync`), the
  reasons and the telemetry events read the same from both languages. Each answers what
  the Erlang function answers, `{:ok, value}`, `:ok` or `{:error, reason}` (a traced call's
  `{:ok, value, stamps}` or `{:error, reason, stamps}`), with every buffer in it an
  `Erlcuda.Buffer` and every program an `Erlcuda.Program`.

  Every function that answers so has a bang variant (`launch_sync!/3`, `upload!/2`, ...)
  that answers the value alone (`:ok` where the plain one answers `:ok`, `{value, stamps}`
  for a traced call) and raises `Erlcuda.Error`, with the reason, where the plain one
  answers an error. `buffer_info/1`, `info/0,1`, `kernels/0` and `error_codes/0` answer
  their value directly and have none.

  ## Options

  A keyword list (or a map): `device: n` (or `:any`), `format: :list | :binary`,
  `timeout: ms` (or `:infinity`), `wait: ms`, `keep: true`, `type: :f32`, `trace: true`,
  `node: node`, and for user kernels `grid:`, `block:`, `shared:`, `elements:`. They mean
  what the Erlang API's options mean (`h :erlcuda`).

  ## Vectors, binaries and Nx

  A vector is a list of numbers, a binary of its element type in little-endian order, or
  an `Erlcuda.Buffer`. With `format: :binary` a vector result is such a binary. So the
  whole interop with an `Nx` tensor is `Nx.to_binary/1` on the way in and
  `Nx.from_binary/2` on the way out (on a little-endian host, as x86-64 and ARM64 are),
  with the element types mapped as:

  | erlcuda | Nx |
  |---|---|
  | `:f32` | `{:f, 32}` |
  | `:f64` | `{:f, 64}` |
  | `:i32` | `{:s, 32}` |
  | `:u32` | `{:u, 32}` |
  | `:i64` | `{:s, 64}` |
  | `:u8` | `{:u, 8}` |

      b = Erlcuda.upload!(Nx.to_binary(t), type: :f32)
      Nx.from_binary(Erlcuda.launch_sync!(:vector_add, [b, b], format: :binary), {:f, 32})

  erlcuda does not depend on Nx.

  ## Messages

  `launch/3` and `run/3` answer `{:ok, job_id}` at once; the reply arrives later as the
  message `{:erlcuda, job_id, result}`, exactly once. `await/2` takes it from the mailbox
  and converts it; a process that receives it itself (a GenServer's `handle_info/2`, say)
  gets the Erlang API's terms and turns them into structs with `from_erlang/1`.
  """

  alias Erlcuda.{Buffer, Error, Program}

  @typedoc "An element type."
  @type element_type :: :f32 | :f64 | :i32 | :u32 | :i64 | :u8

  @typedoc "A list of numbers, a little-endian binary of its element type, or a buffer."
  @type vector :: [number()] | binary() | Buffer.t()

  @typedoc "A built-in kernel, a loaded one, or a program."
  @type kernel :: atom() | Program.t()

  @typedoc "A keyword list or a map of options (see the module doc)."
  @type options :: keyword() | map()

  @type job_id :: pos_integer()

  @typedoc "A result: a vector (a list or a binary), a float, a buffer, or a list of those."
  @type result :: [number()] | binary() | float() | Buffer.t() | [result()]

  @typedoc "A traced job's time by stage, in nanoseconds (`trace: true`)."
  @type stamps :: %{binary() => non_neg_integer()}

  @typedoc "Why a call failed: the Erlang API's `reason()` (see `Erlcuda.Error`)."
  @type reason :: term()

  @typedoc "What a call answers."
  @type answer(value) ::
          {:ok, value}
          | {:error, reason()}
          | {:ok, value, stamps()}
          | {:error, reason(), stamps()}

  # Launches.

  @doc """
  Queue a job: `{:ok, job_id}` at once, and later the message `{:erlcuda, job_id, result}`
  (take it with `await/2`). What can be checked at once is `{:error, reason}`.

      iex> {:ok, id} = Erlcuda.launch(:vector_add, [[1.0], [2.0]])
      iex> Erlcuda.await(id)
      {:ok, [3.0]}
  """
  @spec launch(kernel(), [vector() | number()], options()) :: {:ok, job_id()} | {:error, reason()}
  def launch(kernel, args, opts \\ []),
    do: from_erlang(:erlcuda.launch(to_erlang(kernel), to_erlang(args), opts))

  @doc "`launch/3`, answering the job id or raising `Erlcuda.Error`."
  @spec launch!(kernel(), [vector() | number()], options()) :: job_id()
  def launch!(kernel, args, opts \\ []), do: unwrap!(launch(kernel, args, opts))

  @doc """
  Run a job and wait for its result, at most `timeout:` ms (default 5000).

      iex> Erlcuda.launch_sync(:dot_product, [[1.0, 2.0], [3.0, 4.0]])
      {:ok, 11.0}
      iex> Erlcuda.launch_sync(:fft, [[1.0]])
      {:error, {:unknown_kernel, :fft}}
  """
  @spec launch_sync(kernel(), [vector() | number()], options()) :: answer(result())
  def launch_sync(kernel, args, opts \\ []),
    do: from_erlang(:erlcuda.launch_sync(to_erlang(kernel), to_erlang(args), opts))

  @doc """
  `launch_sync/3`, answering the result (`{result, stamps}` with `trace: true`) or raising
  `Erlcuda.Error`.

      iex> Erlcuda.launch_sync!(:reduce, [[1, 2, 3]])
      6.0
  """
  @spec launch_sync!(kernel(), [vector() | number()], options()) ::
          result() | {result(), stamps()}
  def launch_sync!(kernel, args, opts \\ []), do: unwrap!(launch_sync(kernel, args, opts))

  @doc """
  Wait at most `timeout` ms (or `:infinity`) for the reply of a job that this process
  launched with `launch/3` or `run/3`, take it from the mailbox and answer it.
  `{:error, :timeout}` drops a job still unanswered, so that no late reply comes.
  """
  @spec await(job_id(), timeout()) :: answer(result())
  def await(job_id, timeout \\ 5000), do: from_erlang(:erlcuda.await(job_id, timeout))

  @doc "`await/2`, answering the result or raising `Erlcuda.Error`."
  @spec await!(job_id(), timeout()) :: result() | {result(), stamps()}
  def await!(job_id, timeout \\ 5000), do: unwrap!(await(job_id, timeout))

  @doc """
  The backend, its devices with their counters and memory, the worker's OS pid and
  status (`h :erlcuda.info`); `info(:cluster)` describes every node of the cluster.
  """
  @spec info() :: map()
  def info, do: :erlcuda.info()

  @spec info(:cluster) :: map() | {:error, reason()}
  def info(what), do: :erlcuda.info(what)

  @doc "The kernels a launch may name, with their parameters and results."
  @spec kernels() :: [map()]
  def kernels, do: :erlcuda.kernels()

  @doc "The codes a `{:cuda, code, text}` reason can carry."
  @spec error_codes() :: [atom()]
  def error_codes, do: :erlcuda.error_codes()

  # Buffers.

  @doc """
  Copy a vector to a device (`device: n`, default 0) as a buffer of `type:` (default
  `:f32`) owned by this process.

      iex> {:ok, buffer} = Erlcuda.upload([1.0, 2.0, 3.0], type: :f64)
      iex> {buffer.type, buffer.elements}
      {:f64, 3}
      iex> Erlcuda.download(buffer)
      {:ok, [1.0, 2.0, 3.0]}
  """
  @spec upload([number()] | binary(), options()) :: answer(Buffer.t())
  def upload(vector, opts \\ []), do: from_erlang(:erlcuda.upload(vector, opts))

  @doc "`upload/2`, answering the buffer or raising `Erlcuda.Error`."
  @spec upload!([number()] | binary(), options()) :: Buffer.t() | {Buffer.t(), stamps()}
  def upload!(vector, opts \\ []), do: unwrap!(upload(vector, opts))

  @doc """
  A buffer's elements, as a list of numbers or, with `format: :binary`, a binary. The
  buffer stays as it is.
  """
  @spec download(Buffer.t(), options()) :: answer([number()] | binary())
  def download(buffer, opts \\ []), do: from_erlang(:erlcuda.download(to_erlang(buffer), opts))

  @doc "`download/2`, answering the elements or raising `Erlcuda.Error`."
  @spec download!(Buffer.t(), options()) :: [number()] | binary() | {term(), stamps()}
  def download!(buffer, opts \\ []), do: unwrap!(download(buffer, opts))

  @doc "A buffer of `n` zeros of `type` on a device (`device: n`, default 0)."
  @spec zeros(element_type(), non_neg_integer(), options()) :: answer(Buffer.t())
  def zeros(type, n, opts \\ []), do: from_erlang(:erlcuda.zeros(type, n, opts))

  @doc "`zeros/3`, answering the buffer or raising `Erlcuda.Error`."
  @spec zeros!(element_type(), non_neg_integer(), options()) :: Buffer.t()
  def zeros!(type, n, opts \\ []), do: unwrap!(zeros(type, n, opts))

  @doc "A buffer of `n` elements of `type`, their values undefined (an allocation alone)."
  @spec empty(element_type(), non_neg_integer(), options()) :: answer(Buffer.t())
  def empty(type, n, opts \\ []), do: from_erlang(:erlcuda.empty(type, n, opts))

  @doc "`empty/3`, answering the buffer or raising `Erlcuda.Error`."
  @spec empty!(element_type(), non_neg_integer(), options()) :: Buffer.t()
  def empty!(type, n, opts \\ []), do: unwrap!(empty(type, n, opts))

  @doc """
  Free a buffer now; only its owner may (`{:error, :not_owner}` for others). A buffer
  already freed or lost is `:ok`.
  """
  @spec free(Buffer.t()) :: :ok | {:error, reason()}
  def free(buffer), do: from_erlang(:erlcuda.free(to_erlang(buffer)))

  @doc "`free/1`, answering `:ok` or raising `Erlcuda.Error`."
  @spec free!(Buffer.t()) :: :ok
  def free!(buffer), do: unwrap!(free(buffer))

  @doc """
  Hand a buffer to another process, which owns it from now on (it is freed when that
  process exits). Only the owner may.
  """
  @spec give(Buffer.t(), pid()) :: :ok | {:error, reason()}
  def give(buffer, pid), do: from_erlang(:erlcuda.give(to_erlang(buffer), pid))

  @doc "`give/2`, answering `:ok` or raising `Erlcuda.Error`."
  @spec give!(Buffer.t(), pid()) :: :ok
  def give!(buffer, pid), do: unwrap!(give(buffer, pid))

  @doc """
  What a buffer is, as a map: `node`, `device`, `id`, `type`, `elements`, `bytes`, `epoch`
  and `owner` (`:undefined` once it is freed or lost), or `{:error, reason}`.
  """
  @spec buffer_info(Buffer.t()) :: map() | {:error, reason()}
  def buffer_info(buffer), do: from_erlang(:erlcuda.buffer_info(to_erlang(buffer)))

  @doc """
  A copy of a buffer on `node` (a node of the cluster, or this one; `device: n` there,
  default 0), owned by this process. The buffer stays as it is.
  """
  @spec transfer(Buffer.t(), node(), options()) :: {:ok, Buffer.t()} | {:error, reason()}
  def transfer(buffer, node, opts \\ []),
    do: from_erlang(:erlcuda.transfer(to_erlang(buffer), node, opts))

  @doc "`transfer/3`, answering the copy or raising `Erlcuda.Error`."
  @spec transfer!(Buffer.t(), node(), options()) :: Buffer.t()
  def transfer!(buffer, node, opts \\ []), do: unwrap!(transfer(buffer, node, opts))

  # User kernels.

  @doc """
  Compile CUDA C `source` (nvcc on a GPU, g++ on the cpu backend) and load it as `module`,
  declaring its kernels as `[name: params]`, each param `{:in | :out | :inout, type}` or
  `{:scalar, type}`. Options: `options: [flag]` (nvcc flags from an allow-list),
  `timeout: ms` (default 120000). See `h :erlcuda.load` for what a launch passes and gets.
  """
  @spec load(atom(), iodata(), keyword([tuple()]), keyword()) :: :ok | {:error, reason()}
  def load(module, source, kernels, opts \\ []),
    do: from_erlang(:erlcuda.load(module, source, kernels, opts))

  @doc "`load/4`, answering `:ok` or raising `Erlcuda.Error` (a `{:compile, log}` one, say)."
  @spec load!(atom(), iodata(), keyword([tuple()]), keyword()) :: :ok
  def load!(module, source, kernels, opts \\ []), do: unwrap!(load(module, source, kernels, opts))

  @doc """
  Write, compile and load a kernel `name` that runs the C statement `operation` for every
  element: `inputs` as `[var: type]` for vectors and `[var: {:scalar, type}]` for scalars,
  `outputs` as `[var: type]`.

      iex> Erlcuda.elementwise(:saxpy, [a: {:scalar, :f32}, x: :f32, y: :f32], [z: :f32],
      ...>                     "z = a * x + y")
      :ok
      iex> Erlcuda.launch_sync(:saxpy, [2.0, [1.0, 2.0], [1.0, 1.0]])
      {:ok, [3.0, 5.0]}
      iex> Erlcuda.unload(:saxpy)
      :ok
  """
  @spec elementwise(atom(), keyword(), keyword(), iodata(), keyword()) :: :ok | {:error, reason()}
  def elementwise(name, inputs, outputs, operation, opts \\ []),
    do: from_erlang(:erlcuda.elementwise(name, inputs, outputs, operation, opts))

  @doc "`elementwise/5`, answering `:ok` or raising `Erlcuda.Error`."
  @spec elementwise!(atom(), keyword(), keyword(), iodata(), keyword()) :: :ok
  def elementwise!(name, inputs, outputs, operation, opts \\ []),
    do: unwrap!(elementwise(name, inputs, outputs, operation, opts))

  @doc "Drop a loaded module; one that is not loaded is `:ok`."
  @spec unload(atom()) :: :ok | {:error, reason()}
  def unload(module), do: from_erlang(:erlcuda.unload(module))

  @doc "`unload/1`, answering `:ok` or raising `Erlcuda.Error`."
  @spec unload!(atom()) :: :ok
  def unload!(module), do: unwrap!(unload(module))

  # Programs.

  @doc """
  A program: kernels on device data, run in one launch by `run/3` or `run_sync/3`.

  `spec` is a map of `inputs` (names, or `{name, type}` to fix a vector's type), `steps`
  (`{name, kernel, args}` in order, each argument an input's or an earlier step's name,
  `{step, n}` for a step's nth result, a number or a buffer), `outputs` (a step's name,
  `{step, n}`, or a list of those) and, optionally, `name`. Options: `fuse: false`,
  `graph: false` (`h :erlcuda.program`). A spec that cannot run is
  `{:error, {:bad_program, text}}`.

      iex> {:ok, p} = Erlcuda.program(%{inputs: [:a, :b],
      ...>                               steps: [{:s, :vector_add, [:a, :b]}, {:t, :reduce, [:s]}],
      ...>                               outputs: [:t, :s]})
      iex> Erlcuda.run_sync(p, [[1.0, 2.0], [3.0, 4.0]])
      {:ok, [10.0, [4.0, 6.0]]}
  """
  @spec program(map(), keyword() | map()) :: {:ok, Program.t()} | {:error, reason()}
  def program(spec, opts \\ []), do: from_erlang(:erlcuda.program(to_erlang(spec), opts))

  @doc "`program/2`, answering the program or raising `Erlcuda.Error`."
  @spec program!(map(), keyword() | map()) :: Program.t()
  def program!(spec, opts \\ []), do: unwrap!(program(spec, opts))

  @doc """
  Run a program on `inputs` (in the order of its inputs: vectors, buffers, numbers), as
  `launch/3` runs a kernel: `{:ok, run_id}` at once, the outputs later (`await/2`). A step
  that refuses these inputs is `{:error, {:step, index, reason}}` (index from 1).
  """
  @spec run(Program.t(), [vector() | number()], options()) :: {:ok, job_id()} | {:error, reason()}
  def run(program, inputs, opts \\ []),
    do: from_erlang(:erlcuda.run(to_erlang(program), to_erlang(inputs), opts))

  @doc "`run/3`, answering the run's id or raising `Erlcuda.Error`."
  @spec run!(Program.t(), [vector() | number()], options()) :: job_id()
  def run!(program, inputs, opts \\ []), do: unwrap!(run(program, inputs, opts))

  @doc "Run a program and wait for its outputs, as `launch_sync/3` runs a kernel."
  @spec run_sync(Program.t(), [vector() | number()], options()) :: answer(result())
  def run_sync(program, inputs, opts \\ []),
    do: from_erlang(:erlcuda.run_sync(to_erlang(program), to_erlang(inputs), opts))

  @doc "`run_sync/3`, answering the outputs or raising `Erlcuda.Error`."
  @spec run_sync!(Program.t(), [vector() | number()], options()) ::
          result() | {result(), stamps()}
  def run_sync!(program, inputs, opts \\ []), do: unwrap!(run_sync(program, inputs, opts))

  # The boundary.

  @doc """
  `term` with every Erlang buffer and program in it (in lists, tuples and maps) turned into
  an `Erlcuda.Buffer` or `Erlcuda.Program`: for a reply received by hand,
  `{:erlcuda, id, result}`.
  """
  @spec from_erlang(term()) :: term()
  def from_erlang(term), do: convert(term, &from_leaf/1)

  @doc """
  `term` with every `Erlcuda.Buffer` and `Erlcuda.Program` in it turned into the Erlang
  API's own term, for a call of `:erlcuda` made directly.
  """
  @spec to_erlang(term()) :: term()
  def to_erlang(term), do: convert(term, &to_leaf/1)

  defp from_leaf(term) do
    cond do
      Buffer.erlang?(term) -> {:ok, Buffer.from_erlang(term)}
      Program.erlang?(term) -> {:ok, Program.from_erlang(term)}
      true -> :none
    end
  end

  defp to_leaf(%Buffer{} = buffer), do: {:ok, Buffer.to_erlang(buffer)}
  defp to_leaf(%Program{} = program), do: {:ok, Program.to_erlang(program)}
  defp to_leaf(_), do: :none

  # A term is rebuilt only where a leaf is inside it, so a vector of a million numbers is
  # read once and never copied.
  defp convert(term, leaf) do
    case leaf.(term) do
      {:ok, new} -> new
      :none -> if inside?(term, leaf), do: rebuild(term, leaf), else: term
    end
  end

  defp inside?(term, leaf) do
    case leaf.(term) do
      {:ok, _} -> true
      :none -> inside_of?(term, leaf)
    end
  end

  # Numbers are never leaves: a vector is read at a number's cost an element.
  defp inside_of?([head | tail], leaf) when is_number(head), do: inside_tail?(tail, leaf)
  defp inside_of?([head | tail], leaf), do: inside?(head, leaf) or inside_tail?(tail, leaf)
  defp inside_of?([], _), do: false
  defp inside_of?(term, leaf) when is_tuple(term), do: inside_of?(Tuple.to_list(term), leaf)
  defp inside_of?(%_{}, _), do: false

  defp inside_of?(term, leaf) when is_map(term),
    do: Enum.any?(term, fn {k, v} -> inside?(k, leaf) or inside?(v, leaf) end)

  defp inside_of?(_, _), do: false

  # An improper list's tail is a term of its own.
  defp inside_tail?(tail, leaf) when is_list(tail), do: inside_of?(tail, leaf)
  defp inside_tail?(tail, leaf), do: inside?(tail, leaf)

  defp rebuild(term, leaf) when is_list(term), do: rebuild_list(term, leaf)

  defp rebuild(term, leaf) when is_tuple(term),
    do: term |> Tuple.to_list() |> rebuild_list(leaf) |> List.to_tuple()

  defp rebuild(term, leaf) when is_map(term),
    do: Map.new(term, fn {k, v} -> {convert(k, leaf), convert(v, leaf)} end)

  defp rebuild_list([head | tail], leaf), do: [convert(head, leaf) | rebuild_list(tail, leaf)]
  defp rebuild_list([], _), do: []
  defp rebuild_list(tail, leaf), do: convert(tail, leaf)

  defp unwrap!(:ok), do: :ok
  defp unwrap!({:ok, value}), do: value
  defp unwrap!({:ok, value, stamps}), do: {value, stamps}
  defp unwrap!({:error, reason}), do: raise(Error, reason: reason)
  defp unwrap!({:error, reason, stamps}), do: raise(Error, reason: reason, stamps: stamps)
end
