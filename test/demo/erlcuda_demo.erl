%% `make demo': the four kernels launched from Erlang, with their results and the backend.
%% Not part of the application: the Makefile's demo target compiles it into _build/demo.
-module(erlcuda_demo).

-export([main/0]).

-spec main() -> ok.
main() ->
    {ok, _} = application:ensure_all_started(erlcuda),
    Info = erlcuda:info(),
    io:format("erlcuda demo: backend ~p (~ts), ~b device(s)~n",
              [maps:get(backend, Info), maps:get(reason, Info, <<>>), maps:get(devices, Info)]),
    A = [1.0, 2.0, 3.0, 4.0],
    B = [10.0, 20.0, 30.0, 40.0],
    show("vector_add(A, B)", erlcuda:launch_sync(vector_add, [A, B])),
    show("reduce(A)", erlcuda:launch_sync(reduce, [A])),
    show("dot_product(A, B)", erlcuda:launch_sync(dot_product, [A, B])),
    %% [[1,2],[3,4]] x [[5,6],[7,8]]
    show("matmul(2x2, 2x2)", erlcuda:launch_sync(matmul, [A, [5, 6, 7, 8], 2, 2, 2])),
    {ok, Job} = erlcuda:launch(vector_add, [A, B], [{format, binary}]),
    receive
        {erlcuda, Job, {ok, Bin}} ->
            io:format("  async vector_add as an f32 binary: ~p~n", [Bin])
    after 5000 -> io:format("  async vector_add: no reply~n")
    end,
    show("bad input", erlcuda:launch_sync(vector_add, [A, [1.0]])),
    ok.

show(What, Result) ->
    io:format("  ~-20s -> ~p~n", [What, Result]).
