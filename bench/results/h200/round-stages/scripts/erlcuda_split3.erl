-module(erlcuda_split3).
-export([main/0]).

main() ->
    application:load(erlcuda),
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    application:set_env(erlcuda, backend, list_to_atom(os:getenv("BACKEND", "cuda"))),
    case os:getenv("THRESH", "auto") of
        "auto" -> ok;
        "huge" -> application:set_env(erlcuda, shm_threshold, 1 bsl 40)
    end,
    {ok, _} = application:ensure_all_started(erlcuda),
    io:format("threshold ~p~n", [maps:get(shm_threshold, erlcuda:info())]),
    timer:sleep(500),
    [run(N, Gap) || _ <- [1, 2], N <- [1000, 10000], Gap <- [0, 5, 0, 5]],
    ok.

bin(N) -> << <<(float(I)):32/float-little>> || I <- lists:seq(1, N) >>.

add(A, B) ->
    T0 = erlang:monotonic_time(nanosecond),
    {ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary}, {timeout, 5000}]),
    (erlang:monotonic_time(nanosecond) - T0) / 1000.

%% Gap 0: 300 back to back; Gap G: 5 blocks of 60, G ms asleep before each (its first
%% job untimed, as bench/bus does).
run(N, Gap) ->
    A = bin(N), B = bin(N),
    _ = [add(A, B) || _ <- lists:seq(1, 30)],
    Ts = case Gap of
             0 -> [add(A, B) || _ <- lists:seq(1, 300)];
             _ -> lists:append([begin timer:sleep(Gap), _ = add(A, B),
                                      [add(A, B) || _ <- lists:seq(1, 60)] end
                                || _ <- lists:seq(1, 5)])
         end,
    S = lists:sort(Ts),
    P = fun(Q) -> lists:nth(max(1, round(Q * length(S))), S) end,
    io:format("~8b gap ~2b ms  p10 ~7.1f p50 ~7.1f p90 ~7.1f~n", [N, Gap, P(0.1), P(0.5), P(0.9)]).
