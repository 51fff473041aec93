%% @doc GPU compute for the BEAM.
%%
%% `launch/2,3' returns `{ok, JobId}' at once; the caller later receives
%% `{erlcuda, JobId, {ok, Result}}' or `{erlcuda, JobId, {error, Reason}}', exactly once.
%% `launch_sync/2,3' waits for that reply. The work runs in a separate worker OS process
%% (see `erlcuda_port'), so a crash there never takes the node down.
-module(erlcuda).

-export([launch/2, launch/3, launch_sync/2, launch_sync/3, info/0, error_codes/0]).

-export_type([kernel/0, vector/0, device/0, format/0, option/0, job_id/0, result/0,
              reason/0, cuda_code/0]).

-type kernel() :: vector_add | reduce | dot_product | matmul.
%% A vector: a list of numbers, or a little-endian f32 binary.
-type vector() :: [number()] | binary().
-type device() :: non_neg_integer() | any.
-type format() :: list | binary.
-type option() :: {device, device()} | {format, format()} | {timeout, timeout()}
                | {trace, boolean()}.
-type job_id() :: pos_integer().
-type result() :: [float()] | binary() | float().
-type cuda_code() :: out_of_memory | launch_failed | illegal_address | invalid_value
                   | not_supported | unknown.
-type reason() :: {unknown_kernel, term()}
                | {bad_device, term()}
                | {bad_args, binary()}
                | {bad_option, term()}
                | timeout
                | overloaded
                | too_large
                | {worker_down, term()}
                | {backend_unavailable, binary()}
                | {cuda, cuda_code(), binary()}
                | {internal, binary()}.

%% @equiv launch(Kernel, Args, [])
-spec launch(Kernel :: kernel(), Args :: [vector() | non_neg_integer()]) ->
    {ok, job_id()} | {error, reason()}.
launch(Kernel, Args) ->
    launch(Kernel, Args, []).

%% @doc Queue a job; the result is sent to the caller as `{erlcuda, JobId, Result}'.
-spec launch(Kernel :: kernel(), Args :: [vector() | non_neg_integer()],
             Opts :: [option()]) -> {ok, job_id()} | {error, reason()}.
launch(Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts) of
        {ok, Job} -> erlcuda_port:submit(Job, self());
        {error, _} = Error -> Error
    end.

%% @equiv launch_sync(Kernel, Args, [])
-spec launch_sync(Kernel :: kernel(), Args :: [vector() | non_neg_integer()]) ->
    {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args) ->
    launch_sync(Kernel, Args, []).

%% @doc Run a job and wait for its result, at most `{timeout, Ms}' (default 5000).
%% The reply goes to a process alias that is dropped on timeout, so a late result never
%% reaches the caller's mailbox.
-spec launch_sync(Kernel :: kernel(), Args :: [vector() | non_neg_integer()],
                  Opts :: [option()]) -> {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts) of
        {ok, #{timeout := Timeout} = Job} ->
            Alias = alias([explicit_unalias]),
            case erlcuda_port:submit(Job, Alias) of
                {ok, JobId} ->
                    receive
                        {erlcuda, JobId, Result} -> unalias(Alias), Result
                    after Timeout ->
                        unalias(Alias),
                        receive {erlcuda, JobId, _} -> ok after 0 -> ok end,
                        {error, timeout}
                    end;
                {error, _} = Error ->
                    unalias(Alias),
                    Error
            end;
        {error, _} = Error ->
            Error
    end.

%% @doc The backend, its devices with their counters and memory, and the worker's OS pid.
-spec info() -> #{backend := cpu | cuda, devices := non_neg_integer(),
                  worker_os_pid := integer() | undefined, atom() => term()}.
info() ->
    erlcuda_port:info().

%% @doc The codes a `{cuda, Code, Message}' error can carry.
-spec error_codes() -> [cuda_code()].
error_codes() ->
    [out_of_memory, launch_failed, illegal_address, invalid_value, not_supported, unknown].
