%% @private
%% erlcuda's events, through the `telemetry' library where it is present (an optional
%% dependency: nothing here needs it; the module is looked up once, as the application
%% starts). This module makes the events and runs their handlers in the process that calls
%% it; which process that is decides what a slow handler can hold up, so the rule is:
%% a handler runs in the process that waits for what the event reports, or in erlcuda's
%% event process (`erlcuda_events'), never in the port owner, the port's writer, or any
%% other process that answers other callers.
%%
%% Durations are in native time units (`erlang:convert_time_unit/3').
%%
%% | event | measurements | metadata | handlers run in |
%% |---|---|---|---|
%% | `[erlcuda, job, start]' | `system_time', `monotonic_time' | `job_id', `kernel', `device', `bytes_in', `bytes_out', `elements' | the launching process (for a job on another node, its proxy there), before the job is written |
%% | `[erlcuda, job, stop]' | `duration', `monotonic_time' | as start | the waiting process (`launch_sync', `await', a proxy) once it has the result; for a `launch' nobody awaits, or a waiting process that was killed, the event process |
%% | `[erlcuda, job, exception]' | `duration', `monotonic_time' | as start, and `kind' (`error'), `reason' | as stop; and the launching process when its write fails |
%% | `[erlcuda, compile, stop]' | `duration' (the worker's compile, hits included) | `module', `cache_hit', `result' (`ok' or the load's `{error, Reason}') | the process that called `load' or `elementwise' |
%% | `[erlcuda, worker, start]' | `duration' (spawn to ready), `system_time' | `os_pid', `backend', `devices', `status', `restarts' | the event process |
%% | `[erlcuda, worker, down]' | `duration' (its life), `system_time' | `os_pid', `backend', `reason' | the event process |
%% | `[erlcuda, worker, restart]' | `backoff' (the wait before the next start), `system_time' | `restarts', `reason' (why the last one ended) | the event process |
%% | `[erlcuda, worker, stop]' | `duration' (its life), `system_time' | `os_pid', `backend', `reason' | the event process |
%%
%% A job has its start event and exactly one stop or exception event (but for a caller
%% killed while a start handler runs in it), for the handlers
%% attached to an `[erlcuda, job, _]' event when it started (with none, nothing about it
%% is ever sent anywhere). `bytes_in' counts the operand bytes sent to the worker (buffers
%% already on a device count nothing), `bytes_out' the result bytes it sends back (0 for
%% results kept on the device), `elements' the largest vector of the launch, operand or
%% result. A job whose waiting process stopped waiting (its timeout) ends with an exception
%% of reason `timeout' there, whatever the worker does with it later; one whose waiting
%% process was killed has its event run by the event process, as does a `launch' whose
%% caller died first (`caller_down' when the job was dropped unanswered).
-module(erlcuda_telemetry).

-export([init/0, listening/1, execute/3, job_start/3, job_stop/2, job_stop/3, compile/2]).

-export_type([span/0]).

-define(KEY, {?MODULE, library}).

%% A job's start as its stop needs it: when it started (native monotonic time) and its
%% metadata; `none' when nobody listened as it started.
-type span() :: none | {integer(), map()}.

%% @doc Find `telemetry'.
-spec init() -> ok.
init() ->
    Library = case code:ensure_loaded(telemetry) of
                  {module, telemetry} -> telemetry;
                  _ -> none
              end,
    persistent_term:put(?KEY, Library).

%% @doc Whether a handler is attached to an event under `Prefix'.
-spec listening([atom()]) -> boolean().
listening(Prefix) ->
    case library() of
        none -> false;
        Library -> safely(fun() -> Library:list_handlers(Prefix) =/= [] end, false)
    end.

%% @doc Run the handlers of `Event' in this process. A handler that fails costs no job its
%% launch or its reply (telemetry detaches it).
-spec execute([atom()], map(), map()) -> ok.
execute(Event, Measurements, Meta) ->
    case library() of
        none -> ok;
        Library -> safely(fun() -> Library:execute(Event, Measurements, Meta), ok end, ok)
    end.

%% @doc A checked job about to be written as `Id' to `Device': its start event, and what its
%% stop event needs (`none' when nobody listens: the job then costs nothing more here).
-spec job_start(erlcuda:job_id(), erlcuda_job:job(), non_neg_integer()) -> span().
job_start(Id, Job, Device) ->
    case listening([erlcuda, job]) of
        false ->
            none;
        true ->
            Now = erlang:monotonic_time(),
            Meta = job_meta(Id, Job, Device),
            execute([erlcuda, job, start],
                    #{system_time => erlang:system_time(), monotonic_time => Now}, Meta),
            {Now, Meta}
    end.

%% @doc The job's stop event (an `{ok, ...}' result) or exception event (`{error, ...}'),
%% now, in this process.
-spec job_stop(span(), term()) -> ok.
job_stop(none, _) ->
    ok;
job_stop(Span, Result) ->
    job_stop(Span, Result, erlang:monotonic_time()).

%% @doc The same, for a job that ended at `At' (native monotonic time).
-spec job_stop(span(), term(), integer()) -> ok.
job_stop(none, _, _) ->
    ok;
job_stop({Started, Meta}, Result, At) ->
    Measurements = #{duration => At - Started, monotonic_time => At},
    case Result of
        {error, Reason} ->
            execute([erlcuda, job, exception], Measurements,
                    Meta#{kind => error, reason => Reason});
        {error, Reason, _Stamps} ->
            execute([erlcuda, job, exception], Measurements,
                    Meta#{kind => error, reason => Reason});
        _ ->
            execute([erlcuda, job, stop], Measurements, Meta)
    end.

%% @doc The compile event of a load, from what the worker said of its compile (nothing when
%% it did not get that far).
-spec compile(atom(), {ok | {error, erlcuda:reason()}, map() | none}) -> ok.
compile(_, {_, none}) ->
    ok;
compile(Module, {Result, #{duration_ns := Ns, cache_hit := Hit}}) ->
    execute([erlcuda, compile, stop],
            #{duration => erlang:convert_time_unit(Ns, nanosecond, native)},
            #{module => Module, cache_hit => Hit, result => Result}).

%% A job's metadata: what it moves and how large it is.
job_meta(Id, #{kernel := Kernel, args := Args} = Job, Device) ->
    Expect = maps:get(expect, Job, any),
    Buffers = case Job of
                  #{general := #{buffers := Bs}} -> [N || {erlcuda_buffer, _, _, _, _, _, N} <- Bs];
                  #{} -> []
              end,
    Results = case Expect of
                  {vector, _, N} -> [N];
                  _ -> []
              end,
    #{job_id => Id, kernel => Kernel, device => Device,
      bytes_in => lists:sum([bytes_in(A) || A <- Args]),
      bytes_out => maps:get(bytes_out, Job, bytes_out(Expect)),
      elements => lists:max([0 | [elements(A) || A <- Args] ++ Buffers ++ Results])}.

bytes_in(Bin) when is_binary(Bin) -> byte_size(Bin);
bytes_in({vector, _, Bin}) -> byte_size(Bin);
bytes_in({scalar, _, Bin}) -> byte_size(Bin);
bytes_in(_) -> 0.

bytes_out({vector, Type, N}) -> N * erlcuda_vector:size(Type);
bytes_out(scalar) -> 8;
bytes_out(_) -> 0.

elements(Bin) when is_binary(Bin) -> byte_size(Bin) div erlcuda_vector:size(f32);
elements({vector, Type, Bin}) -> byte_size(Bin) div erlcuda_vector:size(Type);
elements({empty, _, N}) -> N;
elements(_) -> 0.

safely(Fun, Default) ->
    try Fun()
    catch _:_ -> Default
    end.

library() ->
    persistent_term:get(?KEY, none).
