%% List conversion against the code it replaced, for `bench/bus': f32 lists packed into
%% binaries (with the range checks) and binaries unpacked into floats, by erlcuda_vector
%% and by its earlier conversion (below, as it was), in one node and one process, the
%% caller's own, alternately. One event per size: the median nanoseconds per element.
-module(erlcuda_lists).

-export([main/1]).

-define(F32_MAX, 3.4028234663852886e38).
-define(BUDGET_NS, 300000000).

-spec main(file:filename()) -> no_return().
main(ConfigFile) ->
    erlcuda_bench_io:main(ConfigFile, fun run/1).

run(#{sizes := Sizes}) ->
    ok = application:load(erlcuda),
    [measure(N) || N <- Sizes],
    ok.

measure(N) ->
    List = [float(I rem 97) + 0.5 || I <- lists:seq(1, N)],
    {ok, Bin} = erlcuda_vector:pack(f32, List),
    Bin = before_pack(List),
    {ok, List} = erlcuda_vector:unpack(f32, Bin),
    {ok, List} = before_unpack(Bin),
    Reps = max(5, ?BUDGET_NS div max(1, 40 * N)),
    Times = [{time(fun() -> before_pack(List) end), time(fun() -> erlcuda_vector:pack(f32, List) end),
              time(fun() -> before_unpack(Bin) end), time(fun() -> erlcuda_vector:unpack(f32, Bin) end)}
             || _ <- lists:seq(1, Reps)],
    Per = fun(K) -> median([element(K, T) || T <- Times]) / N end,
    erlcuda_bench_io:emit(#{event => result, section => lists, size => N, reps => Reps,
                            pack_before => Per(1), pack_now => Per(2),
                            unpack_before => Per(3), unpack_now => Per(4)}).

time(Fun) ->
    T0 = erlang:monotonic_time(nanosecond),
    _ = Fun(),
    erlang:monotonic_time(nanosecond) - T0.

median(L) ->
    lists:nth(length(L) div 2 + 1, lists:sort(L)).

%% erlcuda_vector's f32 conversion before: an element a step through a checking function,
%% and a comprehension whose length is checked for a non-finite value.
before_pack(List) ->
    << <<(f32(X)):32/float-little>> || X <- List >>.

f32(X) when is_number(X), X =< ?F32_MAX, X >= -?F32_MAX -> X;
f32(X) when is_number(X) -> error(badarg);
f32(X) -> throw({not_a_number, X}).

before_unpack(Bin) ->
    List = [F || <<F:32/float-little>> <= Bin],
    case length(List) * 4 =:= byte_size(Bin) of
        true -> {ok, List};
        false -> {error, non_finite}
    end.
