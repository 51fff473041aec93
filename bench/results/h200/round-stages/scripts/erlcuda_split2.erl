-module(erlcuda_split2).
-export([main/0]).

main() ->
    application:load(erlcuda),
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    application:set_env(erlcuda, backend, list_to_atom(os:getenv("BACKEND", "cuda"))),
    application:set_env(erlcuda, shm_threshold, 1 bsl 40),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(1000),
    [split(N, T) || _ <- [1,2], N <- [1000, 10000], T <- [pipe, sync, syncq, pipe, sync]],
    ok.

bin(N) -> << <<(float(I)):32/float-little>> || I <- lists:seq(1, N) >>.

add(A, B, sync) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary}, {timeout, 5000}]),
    {(erlang:monotonic_time(nanosecond) - T0) / 1000, 0.0};
add(A, B, syncq) ->
    {ok, Job} = erlcuda_job:validate(vector_add, [A, B], [{format, binary}, {timeout, 5000}]),
    Alias = alias([explicit_unalias]),
    T0 = erlang:monotonic_time(nanosecond),
    D = erlcuda_await:deadline(5000),
    {ok, _, _} = erlcuda_submit:submit(Job#{deadline => D}, Alias),
    T1 = erlang:monotonic_time(nanosecond),
    {ok, {ok, _}} = erlcuda_await:reply(Alias, D, none),
    T2 = erlang:monotonic_time(nanosecond),
    unalias(Alias),
    {(T1 - T0) / 1000, (T2 - T1) / 1000};
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
