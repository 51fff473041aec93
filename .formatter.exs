# `mix format` for the Elixir sources (the Erlcuda module and its structs, built into the
# application's ebin), their tests and the mix release sample; `make lint` checks it.
[
  inputs: [
    "erlang/elixir/**/*.ex",
    "test/elixir/**/*.exs",
    "test/release/mix_sample/lib/**/*.ex",
    ".formatter.exs"
  ]
]
