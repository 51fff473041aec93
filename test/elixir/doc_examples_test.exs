# The Elixir examples of the README and of docs/, as written: a ```elixir block right after
# a line `<!-- example: Name -->`; each raises (a failed match) where it does not hold. A word
# after the name says what the block is instead of code to run:
#
# - `config`: a `config/config.exs`: erlcuda's part must hold only known keys, each with a
#   value the application's start accepts (erlcuda_config);
# - `dep`: a mix dependency on erlcuda: a git dependency at the tag of this version (`v`
#   followed by the application's vsn), built by rebar3.
#
# Every ```elixir block of the docs is an example, so that none goes unchecked.

# Nx is not installed here: examples that use it run against this stand-in, which holds a
# tensor as a flat list and reads and writes binaries as Nx does (native byte order, the
# element types erlcuda shares with it), so that the interop the docs show, Nx.to_binary/1
# in and Nx.from_binary/2 out, is checked byte for byte.
unless Code.ensure_loaded?(Nx) do
  defmodule Nx do
    @moduledoc false
    defstruct [:data, :type]

    def tensor(list, opts), do: %Nx{data: list, type: Keyword.fetch!(opts, :type)}
    def to_binary(%Nx{data: data, type: type}), do: for(x <- data, into: <<>>, do: write(x, type))
    def from_binary(binary, type), do: %Nx{data: read(binary, type), type: type}
    def to_flat_list(%Nx{data: data}), do: data

    defp write(x, {:f, size}), do: <<x::float-native-size(size)>>
    defp write(x, {:s, size}), do: <<x::signed-native-size(size)>>
    defp write(x, {:u, size}), do: <<x::unsigned-native-size(size)>>

    defp read(binary, {:f, size}), do: for(<<x::float-native-size(size) <- binary>>, do: x)
    defp read(binary, {:s, size}), do: for(<<x::signed-native-size(size) <- binary>>, do: x)
    defp read(binary, {:u, size}), do: for(<<x::unsigned-native-size(size) <- binary>>, do: x)
  end
end

defmodule DocExamplesTest do
  use ExUnit.Case

  setup_all do
    ErlcudaTestApp.start()
  end

  root = Path.expand("../..", __DIR__)
  files = [Path.join(root, "README.md") | Path.wildcard(Path.join(root, "docs/*.md"))]

  examples =
    for file <- files,
        [name, kind, code] <-
          Regex.scan(
            ~r/<!-- example: (\S+)(?: (\w+))? -->\n```elixir\n(.*?)\n```/s,
            File.read!(file),
            capture: :all_but_first
          ),
        do: {Path.relative_to(file, root), name, kind, code}

  # ```elixir lines not right after an example line, as {file, line number}
  unmarked =
    for file <- files,
        lines = String.split(File.read!(file), "\n"),
        {{previous, line}, n} <- Enum.with_index(Enum.zip(["" | lines], lines), 1),
        line == "```elixir",
        not String.starts_with?(previous, "<!-- example: "),
        do: {Path.relative_to(file, root), n}

  @names Enum.map(examples, fn {_, name, _, _} -> name end)

  test "the README has Elixir examples" do
    assert unquote(Enum.count(examples, fn {file, _, _, _} -> file == "README.md" end)) >= 1
  end

  test "the docs hold the Elixir examples of the Erlcuda module" do
    assert "erlcuda-elixir" in @names
    assert "erlcuda-kernels" in @names
    assert "erlcuda-nx" in @names
    assert "erlcuda-program" in @names
  end

  test "every elixir block of the docs is an example" do
    assert unquote(unmarked) == []
  end

  for {file, name, kind, code} <- examples do
    case kind do
      "" ->
        test "#{file}: example #{name}" do
          # in a process of its own, which owns the buffers the example makes
          task = Task.async(fn -> Code.eval_string(unquote(code), [], file: unquote(file)) end)
          assert {_, _} = Task.await(task, 60_000)
        end

      "config" ->
        test "#{file}: config example #{name}" do
          config = Config.Reader.eval!(unquote(file), unquote(code))
          env = Keyword.fetch!(config, :erlcuda)
          assert env != []
          saved = Application.get_all_env(:erlcuda)

          try do
            for {key, value} <- env, do: Application.put_env(:erlcuda, key, value)
            assert :erlcuda_config.unknown() == []
            assert {:ok, _} = :erlcuda_config.load()
          after
            for {key, _} <- env, do: Application.delete_env(:erlcuda, key)
            for {key, value} <- saved, do: Application.put_env(:erlcuda, key, value)
          end
        end

      "dep" ->
        test "#{file}: dependency example #{name}" do
          {dep, _} = Code.eval_string(unquote(code))
          assert {:erlcuda, opts} = dep
          assert is_binary(Keyword.fetch!(opts, :git))
          assert Keyword.fetch!(opts, :manager) == :rebar3
          assert Keyword.fetch!(opts, :tag) == "v#{Application.spec(:erlcuda, :vsn)}"
        end
    end
  end
end
