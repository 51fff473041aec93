import Config
config :erlcuda, backend: :cpu
