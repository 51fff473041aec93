%% @private
%% The start of a worker process: the interpreter, arguments and environment it is started
%% with.
-module(erlcuda_worker_start).

-export([worker_command/2]).

-export_type([command/0]).

-type command() :: #{python := file:filename(), args := [string()],
                     env := [{string(), string()}]}.

%% @doc The interpreter, arguments and environment that start the worker.
-spec worker_command(erlcuda_config:config(), erlcuda_shm:folder() | none) -> command().
worker_command(Config, Shm) ->
    #{backend := Backend, cpu_devices := CpuDevices, batching := Batching,
      max_batch := MaxBatch, spin_us := SpinUs, worker_args := Extra,
      test_hooks := TestHooks, bench_hooks := BenchHooks, python := Python} = Config,
    BufferLimit = maps:get(buffer_limit, Config, infinity),
    Args = ["-m", "erlcuda", "serve", "--backend", atom_to_list(Backend),
            "--cpu-devices", integer_to_list(CpuDevices),
            "--max-batch", integer_to_list(case Batching of true -> MaxBatch; false -> 1 end),
            "--spin-us", case SpinUs of auto -> "-1"; Us -> integer_to_list(Us) end]
        ++ ["--test-hooks" || TestHooks] ++ ["--bench-hooks" || BenchHooks]
        ++ case BufferLimit of infinity -> []; _ -> ["--buffer-limit", integer_to_list(BufferLimit)] end
        ++ case Shm of #{dir := Dir} -> ["--shm-dir", Dir]; none -> [] end ++ Extra,
    #{python => erlcuda_paths:python(Python),
      args => Args,
      env => [{"PYTHONPATH", python_path(erlcuda_paths:python_dir())},
              {"PYTHONUNBUFFERED", "1"}]}.

python_path(Ours) ->
    case os:getenv("PYTHONPATH") of
        Path when is_list(Path), Path =/= "" -> Ours ++ ":" ++ Path;
        _ -> Ours
    end.
