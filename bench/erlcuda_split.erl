%% Where a vector_add's wall time goes in the caller: before its frame is written (the
%% check, the slots claimed and written, the frame) and waiting for its reply, through each
%% transport alone (the transport probe's jobs: quiet, `transport' pipe or shm), beside
%% `launch_sync' as a user calls it (the transport the application chose, counted and sent
%% as telemetry). Then `launch_sync' back to back against the same jobs in blocks of 60,
%% each after 5 ms asleep and one untimed job, as `bench/bus' times its blocks.
%%
%%   erlc -o /tmp bench/erlcuda_split.erl
%%   ERLCUDA_PYTHON=python3 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp \
%%       -eval 'erlcuda_split:main(), halt().'
%%
%% Prints, per size (1e3, 1e4, 1e5 elements) and way in turn, twice, the p50 of the whole
%% call, of the part before the frame is written (submit) and of the wait (a `launch_sync'
%% only as a whole); then, for 1e3 and 1e4, the p10, p50 and p90 of 300 jobs each way, in
%% turn, twice. Not part of the application.
-module(erlcuda_split).
-export([main/0]).

-define(OPTS, [{format, binary}, {timeout, 5000}]).

main() ->
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(1000),
    [split(N, T) || N <- [1000, 10000, 100000], T <- [shm, pipe, sync, shm, pipe, sync]],
    [gaps(N, Gap) || N <- [1000, 10000], Gap <- [0, 5, 0, 5]],
    ok.

bin(N) -> << <<(float(I)):32/float-little>> || I <- lists:seq(1, N) >>.

add(A, B, sync) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, _} = erlcuda:launch_sync(vector_add, [A, B], ?OPTS),
    {(erlang:monotonic_time(nanosecond) - T0) / 1000, 0.0};
add(A, B, T) ->
    {ok, Job} = erlcuda_job:validate(vector_add, [A, B], ?OPTS),
    Alias = alias([explicit_unalias]),
    T0 = erlang:monotonic_time(nanosecond),
    D = erlcuda_await:deadline(5000),
    {ok, _, _} = erlcuda_submit:submit(Job#{transport => T, quiet => true}, Alias),
    T1 = erlang:monotonic_time(nanosecond),
    {ok, {ok, _}} = erlcuda_await:reply(Alias, D, none),
    T2 = erlang:monotonic_time(nanosecond),
    unalias(Alias),
    {(T1 - T0) / 1000, (T2 - T1) / 1000}.

split(N, T) ->
    A = bin(N), B = bin(N),
    _ = [add(A, B, T) || _ <- lists:seq(1, 50)],
    Ts = [add(A, B, T) || _ <- lists:seq(1, 400)],
    P50 = fun(L) -> pct(lists:sort(L), 0.5) end,
    io:format("~8b ~5s total p50 ~8.1f submit p50 ~8.1f  wait p50 ~8.1f~n",
              [N, T, P50([X + Y || {X, Y} <- Ts]), P50([X || {X, _} <- Ts]),
               P50([Y || {_, Y} <- Ts])]).

%% Gap 0: 300 jobs back to back; else 5 blocks of 60, each after Gap ms asleep and one
%% untimed job.
gaps(N, Gap) ->
    A = bin(N), B = bin(N),
    Call = fun() -> element(1, add(A, B, sync)) end,
    _ = [Call() || _ <- lists:seq(1, 30)],
    Ts = case Gap of
             0 -> [Call() || _ <- lists:seq(1, 300)];
             _ -> lists:append([begin
                                    timer:sleep(Gap),
                                    _ = Call(),
                                    [Call() || _ <- lists:seq(1, 60)]
                                end || _ <- lists:seq(1, 5)])
         end,
    S = lists:sort(Ts),
    io:format("~8b  sync gap ~b ms  p10 ~7.1f p50 ~7.1f p90 ~7.1f~n",
              [N, Gap, pct(S, 0.1), pct(S, 0.5), pct(S, 0.9)]).

%% The Q-quantile of a sorted list (its round(Q * length)-th element).
pct(Sorted, Q) ->
    lists:nth(max(1, round(Q * length(Sorted))), Sorted).
