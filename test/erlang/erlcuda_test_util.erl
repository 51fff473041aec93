%% Helpers shared by the eunit suites.
-module(erlcuda_test_util).

-export([wait_restarted/2, stall/2, with_app/3, reset/2, in_flight/0, wait_until/2,
         no_message/0]).

%% Jobs in flight over every device, as info/0 counts them.
in_flight() ->
    #{device_info := Devices} = erlcuda:info(),
    lists:sum([maps:get(in_flight, D) || D <- Devices]).

%% ok once Cond() holds (N tries, 100 ms apart), else timeout.
wait_until(_, 0) -> timeout;
wait_until(Cond, N) ->
    case Cond() of
        true -> ok;
        false -> timer:sleep(100), wait_until(Cond, N - 1)
    end.

%% Fails on any message in the caller's mailbox.
no_message() ->
    receive Any -> error({stray, Any}) after 0 -> ok end.

%% An eunit fixture: erlcuda started with Defaults overridden by Env, and afterwards
%% stopped with Defaults restored and every other key Env set removed again.
with_app(Defaults, Env, Test) ->
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             application:load(erlcuda),
             [ok = application:set_env(erlcuda, K, V) || {K, V} <- Defaults ++ Env],
             {ok, _} = application:ensure_all_started(erlcuda)
     end,
     fun(_) -> reset(Defaults, [K || {K, _} <- Env]) end,
     Test}.

%% Stop erlcuda, set Defaults, and remove the keys in Extra that Defaults does not name.
reset(Defaults, Extra) ->
    _ = application:stop(erlcuda),
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Defaults],
    [ok = application:unset_env(erlcuda, K) || K <- Extra, not lists:keymember(K, 1, Defaults)],
    ok.

%% Wait (N tries, 100 ms apart) until a worker other than OldPid is up.
wait_restarted(_, 0) -> error(not_restarted);
wait_restarted(OldPid, N) ->
    case catch erlcuda:info() of
        #{worker_os_pid := P, worker_status := up} when is_integer(P), P =/= OldPid -> ok;
        _ -> timer:sleep(100), wait_restarted(OldPid, N - 1)
    end.

%% Keep device Device's thread busy for Ms (a test hook of the worker: the application env
%% test_hooks must be true); returns at once, and the caller later receives
%% {stalled, Reply}, Reply being erlcuda_worker:call/3's {ok, _} | {error, _}.
stall(Device, Ms) ->
    Self = self(),
    spawn(fun() -> Self ! {stalled, erlcuda_worker:call(stall, [Device, Ms], Ms + 5000)} end),
    timer:sleep(50).
