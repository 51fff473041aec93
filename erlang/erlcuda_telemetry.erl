%% @private
%% Job events through `telemetry', when that application is present (an optional
%% dependency: nothing here needs it). The module is looked up once, at start.
%%
%% Events: `[erlcuda, job, start]' (measurements `system_time', `monotonic_time'),
%% `[erlcuda, job, stop]' (`duration', native time units) for a job answered `{ok, _}', and
%% `[erlcuda, job, exception]' (`duration') for one answered `{error, Reason}'; metadata
%% `job_id', `kernel', `device', and `reason' on an exception.
-module(erlcuda_telemetry).

-export([init/0, job_start/3, job_stop/5]).

-define(KEY, {?MODULE, handler}).

%% @doc Find `telemetry' (or a module standing in for it, named by the application env
%% `telemetry_module').
-spec init() -> ok.
init() ->
    Module = application:get_env(erlcuda, telemetry_module, telemetry),
    Handler = case code:ensure_loaded(Module) of
                  {module, Module} -> Module;
                  _ -> none
              end,
    persistent_term:put(?KEY, Handler).

%% @doc Emit the start event; returns the start time, or 0 when nobody listens.
-spec job_start(erlcuda:job_id(), atom(), non_neg_integer()) -> integer().
job_start(Id, Kernel, Device) ->
    case handler() of
        none -> 0;
        Module ->
            Now = erlang:monotonic_time(),
            emit(Module, [erlcuda, job, start],
                 #{system_time => erlang:system_time(), monotonic_time => Now},
                 #{job_id => Id, kernel => Kernel, device => Device}),
            Now
    end.

-spec job_stop(integer(), erlcuda:job_id(), atom(), non_neg_integer(), term()) -> ok.
job_stop(Started, Id, Kernel, Device, Result) ->
    case handler() of
        none -> ok;
        Module ->
            Measurements = #{duration => erlang:monotonic_time() - Started},
            Meta = #{job_id => Id, kernel => Kernel, device => Device},
            case Result of
                {ok, _} ->
                    emit(Module, [erlcuda, job, stop], Measurements, Meta);
                {f32, _} ->  % a vector the launch_sync caller makes into floats itself
                    emit(Module, [erlcuda, job, stop], Measurements, Meta);
                {deferred, _} ->  % the same, from the general path
                    emit(Module, [erlcuda, job, stop], Measurements, Meta);
                {error, Reason} ->
                    emit(Module, [erlcuda, job, exception], Measurements,
                         Meta#{kind => error, reason => Reason});
                _ ->
                    emit(Module, [erlcuda, job, exception], Measurements,
                         Meta#{kind => error, reason => Result})
            end
    end.

%% A handler that fails must cost no job its launch or its reply (telemetry itself
%% detaches failing handlers; a stand-in might not).
emit(Module, Event, Measurements, Meta) ->
    try Module:execute(Event, Measurements, Meta) of
        _ -> ok
    catch
        _:_ -> ok
    end.

handler() ->
    persistent_term:get(?KEY, none).
