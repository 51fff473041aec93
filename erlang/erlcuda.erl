%% @doc GPU compute for the BEAM.
%%
%% `launch/2,3' returns `{ok, JobId}' at once; the caller later receives
%% `{erlcuda, JobId, {ok, Result}}' or `{erlcuda, JobId, {error, Reason}}', exactly once.
%% `launch_sync/2,3' waits for that reply. The work runs in a separate worker OS process,
%% so a crash there never takes the node down.
%%
%% Kernels (see `kernels/0'): `vector_add([A, B])', `reduce([A])', `dot_product([A, B])',
%% `matmul([A, B, M, N, K])'. A vector is a list of numbers or a little-endian f32 binary.
%%
%% Options, as a list of pairs or a map: `{device, N | any}' (default 0), `{format, list |
%% binary}' (a vector result as a list of floats or an f32 binary; default list),
%% `{timeout, Ms}' (`launch_sync' only, default 5000, at most 4294967295 or `infinity'),
%% `{trace, true}' (for benchmarks: the reply carries the worker's time stamps).
-module(erlcuda).

-export([launch/2, launch/3, launch_sync/2, launch_sync/3, info/0, error_codes/0,
         kernels/0]).

-export_type([kernel/0, vector/0, device/0, format/0, option/0, options/0, job_id/0,
              result/0, reason/0, cuda_code/0, stamps/0]).

-type kernel() :: erlcuda_contract:builtin_kernel().
%% A vector: a list of numbers, or a little-endian f32 binary.
-type vector() :: [number()] | binary().
-type device() :: non_neg_integer() | any.
-type format() :: list | binary.
-type option() :: {device, device()} | {format, format()} | {timeout, timeout()}
                | {trace, boolean()}.
-type options() :: [option()] | #{device => device(), format => format(),
                                  timeout => timeout(), trace => boolean()}.
-type job_id() :: pos_integer().
-type result() :: [float()] | binary() | float().
-type cuda_code() :: erlcuda_contract:cuda_code().
%% The worker's time stamps of a traced job (nanoseconds of its own clock), by stage.
-type stamps() :: #{binary() => integer()}.
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
                | {non_finite, binary()}
                | {internal, binary()}.

%% @equiv launch(Kernel, Args, [])
-spec launch(Kernel :: kernel(), Args :: [vector() | non_neg_integer()]) ->
    {ok, job_id()} | {error, reason()}.
launch(Kernel, Args) ->
    launch(Kernel, Args, []).

%% @doc Queue a job; the result is sent to the caller as `{erlcuda, JobId, Result}'
%% (`{erlcuda, JobId, Result, Stamps}' with `{trace, true}'), exactly once.
%%
%% What Erlang can check is answered at once (`{error, Reason}'); the rest arrives as the
%% reply. Every reason is listed in `reason()'.
-spec launch(Kernel :: kernel(), Args :: [vector() | non_neg_integer()], Opts :: options()) ->
    {ok, job_id()} | {error, reason()}.
launch(Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts) of
        {ok, Job} -> erlcuda_submit:submit(Job, self());
        {error, _} = Error -> Error
    end.

%% @equiv launch_sync(Kernel, Args, [])
-spec launch_sync(Kernel :: kernel(), Args :: [vector() | non_neg_integer()]) ->
    {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args) ->
    launch_sync(Kernel, Args, []).

%% @doc Run a job and wait for its result, at most `{timeout, Ms}' (default 5000).
%%
%% The reply goes to a process alias that is dropped on timeout, so a late result never
%% reaches the caller's mailbox. With `{trace, true}' the answer carries the worker's time
%% stamps as a third element: `{ok, Result, Stamps}' or `{error, Reason, Stamps}'.
-spec launch_sync(Kernel :: kernel(), Args :: [vector() | non_neg_integer()],
                  Opts :: options()) ->
    {ok, result()} | {error, reason()} | {ok, result(), stamps()}
    | {error, reason(), stamps()}.
launch_sync(Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts) of
        {ok, #{timeout := Timeout} = Job} ->
            Alias = alias([explicit_unalias]),
            Deadline = case Timeout of
                           infinity -> infinity;
                           _ -> erlang:monotonic_time(millisecond) + Timeout
                       end,
            case erlcuda_submit:submit(Job#{deadline => Deadline}, Alias) of
                {ok, JobId} -> await(JobId, Alias, remaining(Deadline));
                {error, _} = Error -> unalias(Alias), Error
            end;
        {error, _} = Error ->
            Error
    end.

remaining(infinity) -> infinity;
remaining(Deadline) -> max(Deadline - erlang:monotonic_time(millisecond), 0).

await(JobId, Alias, Timeout) ->
    receive
        {erlcuda, JobId, {f32, Bin}} -> unalias(Alias), erlcuda_protocol:f32_list(Bin);
        {erlcuda, JobId, Result} -> unalias(Alias), Result;
        {erlcuda, JobId, {Tag, Value}, Stamps} -> unalias(Alias), {Tag, Value, Stamps}
    after Timeout ->
        unalias(Alias),
        %% A reply that came in just before the alias was dropped.
        receive
            {erlcuda, JobId, _} -> ok;
            {erlcuda, JobId, _, _} -> ok
        after 0 -> ok
        end,
        {error, timeout}
    end.

%% @doc The backend, its devices with their counters and memory, the worker's OS pid and
%% status, and the jobs counted since the application started.
-spec info() -> #{backend := cpu | cuda | undefined, devices := non_neg_integer(),
                  worker_os_pid := integer() | undefined, atom() => term()}.
info() ->
    erlcuda_worker:info().

%% @doc The codes a `{cuda, Code, Message}' error can carry.
-spec error_codes() -> [cuda_code()].
error_codes() ->
    erlcuda_contract:cuda_codes().

%% @doc The kernels a launch may name: each one's parameters (`vector' of an element type,
%% or `dim', a non-negative integer; `length' names the parameters whose product is a
%% vector's length) and its result.
-spec kernels() -> [erlcuda_contract:spec()].
kernels() ->
    erlcuda_catalogue:kernels().
