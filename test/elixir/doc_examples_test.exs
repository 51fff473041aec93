# The Elixir examples of the README and of docs/, as written: a ```elixir block right after
# a line `<!-- example: Name -->`; each raises (a failed match) where it does not hold.

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
  files = [Path.join(root, "README.md") | Path.wildcard(Path.join(root, "docs/**/*.md"))]

  examples =
    for file <- files,
        [name, code] <-
          Regex.scan(~r/<!-- example: (\S+) -->\n```elixir\n(.*?)\n```/s, File.read!(file),
            capture: :all_but_first
          ),
        do: {Path.relative_to(file, root), name, code}

  @names Enum.map(examples, fn {_, name, _} -> name end)

  test "the README has Elixir examples" do
    assert unquote(Enum.count(examples, fn {file, _, _} -> file == "README.md" end)) >= 1
  end

  test "the docs hold the Elixir examples of the Erlcuda module" do
    assert "erlcuda-elixir" in @names
    assert "erlcuda-kernels" in @names
    assert "erlcuda-nx" in @names
  end

  for {file, name, code} <- examples do
    test "#{file}: example #{name}" do
      # in a process of its own, which owns the buffers the example makes
      task = Task.async(fn -> Code.eval_string(unquote(code), [], file: unquote(file)) end)
      assert {_, _} = Task.await(task, 60_000)
    end
  end
end
