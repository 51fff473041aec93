%% What the bench nodes of `bench/chain' and `bench/cluster' share: reading their config and
%% writing one JSON object a line on stdout (`{"event":"done"}' at the end, or
%% `{"event":"error",...}' with the exception).
-module(erlcuda_bench_io).

-export([main/2, emit/1]).

%% @doc Run `Run(Config)' on the map in `ConfigFile' and halt: 0 when it returned.
-spec main(file:filename(), fun((map()) -> term())) -> no_return().
main(ConfigFile, Run) ->
    try
        {ok, [Config]} = file:consult(ConfigFile),
        Run(Config),
        emit(#{event => done}),
        halt(0)
    catch
        Class:Why:Stack ->
            emit(#{event => error,
                   text => iolist_to_binary(io_lib:format("~0p", [{Class, Why, Stack}]))}),
            halt(1)
    end.

%% @doc One JSON object on a line of its own.
-spec emit(map()) -> ok.
emit(Map) ->
    io:put_chars([json(Map), $\n]).

json(M) when is_map(M) ->
    ["{", lists:join(",", [[json(key(K)), ":", json(V)] || {K, V} <- maps:to_list(M)]), "}"];
json(L) when is_list(L) -> ["[", lists:join(",", [json(X) || X <- L]), "]"];
json(B) when is_binary(B) -> [$", escape(B), $"];
json(A) when is_atom(A) -> json(atom_to_binary(A));
json(N) when is_integer(N) -> integer_to_list(N);
json(F) when is_float(F) -> float_to_list(F, [short]).

key(K) when is_atom(K) -> atom_to_binary(K);
key(K) -> K.

escape(B) ->
    << <<(case C of $" -> <<"\\\"">>; $\\ -> <<"\\\\">>; $\n -> <<"\\n">>;
                    _ when C < 32 -> <<"?">>; _ -> <<C>> end)/binary>> || <<C>> <= B >>.
