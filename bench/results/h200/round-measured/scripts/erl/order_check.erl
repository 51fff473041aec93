-module(order_check).
-export([main/1]).

main(Rounds) ->
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    application:set_env(erlcuda, backend, list_to_atom(os:getenv("ERLCUDA_BACKEND", "cpu"))),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(list_to_integer(os:getenv("OC_SLEEP", "500"))),
    Bad = lists:sum([one() || _ <- lists:seq(1, Rounds)]),
    io:format("rounds ~b, callers out of order ~b~n", [Rounds, Bad]).

one() ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {done, self(), caller(C, 50)} end) || C <- lists:seq(1, 200)],
    lists:sum([receive {done, P, R} -> R after 60000 -> error(hung) end || P <- Pids]).

caller(C, Jobs) ->
    Kernels = [vector_add, reduce, dot_product, matmul],
    Launched = [begin
                    K = lists:nth(J rem 4 + 1, Kernels),
                    A = [float(C), float(J), 1.0, 2.0],
                    Args = case K of reduce -> [A]; matmul -> [A, A, 2, 2, 2]; _ -> [A, A] end,
                    {ok, Id} = erlcuda:launch(K, Args),
                    Id
                end || J <- lists:seq(1, Jobs)],
    Arrived = [receive {erlcuda, Id, {ok, _}} -> Id after 30000 -> error(no_reply) end
               || _ <- Launched],
    case Arrived of
        Launched -> 0;
        _ -> io:format("caller ~b: ~w~n   launched ~w~n", [C, lists:sublist(Arrived, 6), lists:sublist(Launched, 6)]), 1
    end.
