defmodule MixSample.MixProject do
  use Mix.Project

  def project do
    [app: :mix_sample, version: "0.1.0", elixir: "~> 1.14", deps: deps(),
     releases: [mix_sample: [include_executables_for: [:unix], strip_beams: [keep: ["Docs"]]]]]
  end

  def application do
    [extra_applications: [:logger], mod: {MixSample, []}]
  end

  defp deps do
    [{:erlcuda, path: System.get_env("ERLCUDA_SOURCE", "../erlcuda"), manager: :rebar3}]
  end
end
