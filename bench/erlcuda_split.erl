%% Where a vector_add's wall time goes in the caller: before its frame is written (the
%% check, the slots claimed and written, the frame) and waiting for its reply, through each
%% transport alone (the transport probe's jobs: quiet, `transport' pipe or shm).
%%
%%   erlc -o /tmp bench/erlcuda_split.erl
%%   ERLCUDA_PYTHON=python3 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp \
%%       -eval 'erlcuda_split:main(), halt().'
%%
%% Prints, per size (1e3, 1e4, 1e5 elements) and transport in turn, twice, the p50 of the whole call, of the part before
%% the frame is written (submit) and of the wait. Not part of the application.
-module(erlcuda_split).
-export([main/0]).

main() ->
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(1000),
    [split(N, T) || N <- [1000, 10000, 100000], T <- [shm, pipe, shm, pipe]],
    ok.

bin(N) -> << <<(float(I)):32/float-little>> || I <- lists:seq(1, N) >>.

add(A, B, T) ->
    {ok, Job} = erlcuda_job:validate(vector_add, [A, B], [{format, binary}, {timeout, 5000}]),
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
    P50 = fun(L) -> lists:nth(200, lists:sort(L)) end,
    io:format("~8b ~5s total p50 ~8.1f submit p50 ~8.1f  wait p50 ~8.1f~n",
              [N, T, P50([X + Y || {X, Y} <- Ts]), P50([X || {X, _} <- Ts]),
               P50([Y || {_, Y} <- Ts])]).
