%% @private
%% The start of a worker process: the interpreter, arguments and environment it is started
%% with, and the check of the hello it answers before it takes jobs (both sides of the same
%% release and protocol, a device count within bounds).
-module(erlcuda_worker_start).

-export([worker_command/2, hello_args/0, check_hello/1]).

-export_type([command/0]).

-type command() :: #{python := file:filename(), args := [string()],
                     env := [{string(), string()}]}.

%% @doc The interpreter, arguments and environment that start the worker.
-spec worker_command(erlcuda_config:config(), erlcuda_shm:folder() | none) -> command().
worker_command(Config, Shm) ->
    #{backend := Backend, cpu_devices := CpuDevices, batching := Batching,
      max_batch := MaxBatch, spin_us := SpinUs, worker_args := Extra,
      worker_module := Module, python_path := PythonPath, python := Python} = Config,
    BufferLimit = maps:get(buffer_limit, Config, infinity),
    Args = ["-m", Module, "serve", "--backend", atom_to_list(Backend),
            "--cpu-devices", integer_to_list(CpuDevices),
            "--max-batch", integer_to_list(case Batching of true -> MaxBatch; false -> 1 end),
            "--spin-us", case SpinUs of auto -> "-1"; Us -> integer_to_list(Us) end]
        ++ case BufferLimit of infinity -> []; _ -> ["--buffer-limit", integer_to_list(BufferLimit)] end
        ++ case Shm of
               #{dir := Dir} ->
                   ["--shm-dir", Dir,
                    "--shm-keep-ms", integer_to_list(maps:get(shm_keep_ms, Config, 10000))];
               none ->
                   []
           end ++ Extra,
    #{python => erlcuda_paths:python(Python),
      args => Args,
      env => [{"PYTHONPATH", python_path(PythonPath ++ [erlcuda_paths:python_dir()])},
              {"PYTHONUNBUFFERED", "1"}]}.

%% The configured directories, then ours, then the inherited path.
python_path(Dirs) ->
    Inherited = case os:getenv("PYTHONPATH") of
                    Path when is_list(Path), Path =/= "" -> [Path];
                    _ -> []
                end,
    string:join(Dirs ++ Inherited, ":").

%% @doc The hello's arguments: this side's version and protocol, which the worker checks.
-spec hello_args() -> [binary() | pos_integer()].
hello_args() ->
    [version(), erlcuda_contract:protocol()].

%% @doc Whether the worker's hello answer lets it take jobs: `ok', or why not.
-spec check_hello(term()) -> ok | {unavailable, binary()} | {failed, term()}.
check_hello(#{backend := _, devices := Devices} = Info)
  when is_integer(Devices), Devices >= 0 ->
    case Devices =< erlcuda_status:max_devices() of
        true -> check_versions(Info);
        false -> {failed, {devices, Devices}}
    end;
check_hello(Other) ->
    {failed, Other}.

check_versions(Info) ->
    Ours = {version(), erlcuda_contract:protocol()},
    Theirs = {maps:get(version, Info, <<"unknown">>), maps:get(protocol, Info, undefined)},
    case {Theirs, maps:get(status, Info, ok)} of
        {Ours, ok} -> ok;
        {Ours, {_, Why}} when is_binary(Why) -> {unavailable, Why};
        {{TheirVersion, TheirProtocol}, _} ->
            {unavailable, iolist_to_binary(
                            io_lib:format("version mismatch: the Erlang side is erlcuda ~ts "
                                          "(protocol ~p), the worker is erlcuda ~ts (protocol "
                                          "~p); install the worker from the same release",
                                          [element(1, Ours), element(2, Ours),
                                           printable(TheirVersion), TheirProtocol]))}
    end.

printable(V) when is_binary(V) -> V;
printable(V) -> io_lib:format("~0p", [V]).

version() ->
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    list_to_binary(Vsn).
