%% Where a lone 1000-element vector_add with lists spends its time beside the same job with
%% binaries: each way in and out timed in turn in one caller, with the conversions alone.
%%
%%   erlc -o /tmp bench/erlcuda_list_parts.erl
%%   ERLCUDA_PYTHON=python3 erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp \
%%       -eval 'erlcuda_list_parts:main(), halt().'
%%
%% Kinds (launch_sync of vector_add, operands in, result out): bb binaries in and out; lb
%% lists in, a binary out; bl binaries in, a list out; ll lists in and out; pack2bb the two
%% lists packed (erlcuda_vector:pack/2, range checked) then bb; pbin bb on the binaries
%% pack/2 just made; bbdec bb then the ETF of 1000 floats decoded as a list result is
%% (erlcuda_protocol:float_list/1); bbunp bb then its binary unpacked (erlcuda_vector);
%% pack2 and unpack those conversions alone. Ten rounds of 300 calls of each kind in turn;
%% prints the p50 of each in µs. Then, alone, per 1000 elements: pack/2 against
%% pack_unranged/2, and float_list/1. Not part of the application.
-module(erlcuda_list_parts).
-export([main/0]).

-define(ROUNDS, 10).
-define(BLOCK, 300).

main() ->
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    {ok, _} = application:ensure_all_started(erlcuda),
    A = << <<(float(I rem 97)):32/float-little>> || I <- lists:seq(1, 1000) >>,
    L = [F || <<F:32/float-little>> <= A],
    {ok, R} = erlcuda:launch_sync(vector_add, [A, A], [{format, binary}]),
    Etf = term_to_binary([F || <<F:32/float-little>> <= R]),
    Kinds = kinds(A, L, R, Etf),
    [{ok, _} = F() || {_, F} <- Kinds],
    Times = lists:foldl(fun(_, Acc) -> round(Kinds, Acc) end, #{}, lists:seq(1, ?ROUNDS)),
    io:format("~p~n", [[{K, p50(maps:get(K, Times))} || {K, _} <- Kinds]]),
    Alone = [{pack, fun() -> erlcuda_vector:pack(f32, L) end},
             {pack_unranged, fun() -> erlcuda_vector:pack_unranged(f32, L) end},
             {float_list, fun() -> erlcuda_protocol:float_list(Etf) end}],
    [io:format("~p~n", [[{K, p50(block(F, 20000))} || {K, F} <- Alone]]) || _ <- [1, 2, 3]],
    ok.

kinds(A, L, R, Etf) ->
    Bin = [{format, binary}],
    Bb = fun() -> erlcuda:launch_sync(vector_add, [A, A], Bin) end,
    Pack = fun() -> erlcuda_vector:pack(f32, L) end,
    [{bb, Bb},
     {lb, fun() -> erlcuda:launch_sync(vector_add, [L, L], Bin) end},
     {bl, fun() -> erlcuda:launch_sync(vector_add, [A, A], []) end},
     {ll, fun() -> erlcuda:launch_sync(vector_add, [L, L], []) end},
     {pack2bb, fun() -> _ = Pack(), _ = Pack(), Bb() end},
     {pbin, fun() ->
                    {ok, PA} = Pack(), {ok, PB} = Pack(),
                    erlcuda:launch_sync(vector_add, [PA, PB], Bin)
            end},
     {bbdec, fun() -> _ = Bb(), erlcuda_protocol:float_list(Etf) end},
     {bbunp, fun() -> {ok, Out} = Bb(), erlcuda_vector:unpack(f32, Out) end},
     {pack2, fun() -> _ = Pack(), Pack() end},
     {unpack, fun() -> erlcuda_vector:unpack(f32, R) end}].

round(Kinds, Acc) ->
    lists:foldl(fun({K, F}, A1) ->
                        Ns = block(F, ?BLOCK),
                        maps:update_with(K, fun(Old) -> Ns ++ Old end, Ns, A1)
                end, Acc, Kinds).

block(F, N) ->
    [begin
         T0 = erlang:monotonic_time(nanosecond),
         _ = F(),
         erlang:monotonic_time(nanosecond) - T0
     end || _ <- lists:seq(1, N)].

p50(Ns) ->
    round(lists:nth(max(1, length(Ns) div 2), lists:sort(Ns)) / 100) / 10.
