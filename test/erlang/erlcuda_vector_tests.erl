%% Typed vectors (erlcuda_vector) without a worker: the element types and their ranges as
%% the contract gives them, packing to and unpacking from the worker's little-endian bytes,
%% range errors, non-finite floats, and scalars.
-module(erlcuda_vector_tests).

-include_lib("eunit/include/eunit.hrl").

types_match_the_contract_test() ->
    Types = erlcuda_contract:element_types(),
    ?assertEqual([f32, f64, i32, u32, i64, u8], Types),
    ?assertEqual(Types, [erlcuda_vector:type(I) || I <- lists:seq(0, 5)]),
    ?assertEqual(lists:seq(0, 5), [erlcuda_vector:index(T) || T <- Types]),
    ?assertEqual(error, erlcuda_vector:type(6)),
    ?assertEqual([4, 8, 4, 4, 8, 1], [erlcuda_vector:size(T) || T <- Types]).

%% Each integer type takes exactly the range the contract gives it, and the part limit of
%% shared memory is the contract's.
ranges_are_the_contracts_test() ->
    Ints = [{T, erlcuda_contract:element_range(T)}
            || T <- erlcuda_contract:element_types(), erlcuda_contract:element_range(T) =/= float],
    ?assertEqual([i32, u32, i64, u8], [T || {T, _} <- Ints]),
    lists:foreach(
      fun({T, {Min, Max}}) ->
              {ok, Bin} = erlcuda_vector:pack(T, [Min, Max]),
              ?assertEqual({ok, [Min, Max]}, erlcuda_vector:unpack(T, Bin)),
              ?assertMatch({error, _}, erlcuda_vector:pack(T, [Min - 1])),
              ?assertMatch({error, _}, erlcuda_vector:pack(T, [Max + 1]))
      end, Ints),
    Big = 64 * erlcuda_shm:part_bytes(0) * erlcuda_contract:shm_parts(),
    ?assert(erlcuda_shm:part_bytes(Big) * erlcuda_contract:shm_parts() >= Big),
    ?assert(erlcuda_shm:part_bytes(Big) * (erlcuda_contract:shm_parts() - 1) < Big).

pack_round_trips_test() ->
    Cases = [{f32, [1.5, -2.0, 0.0, 3]}, {f64, [1.0e300, -1.0e-300, 2, 0.1]},
             {i32, [-2147483648, 0, 2147483647]}, {u32, [0, 4294967295]},
             {i64, [-9223372036854775808, 9223372036854775807]}, {u8, [0, 7, 255]}],
    lists:foreach(
      fun({T, L}) ->
              {ok, Bin} = erlcuda_vector:pack(T, L),
              ?assertEqual(length(L) * erlcuda_vector:size(T), byte_size(Bin)),
              {ok, Back} = erlcuda_vector:unpack(T, Bin),
              Want = case T of
                         f32 -> [float(X) || X <- L];
                         f64 -> [float(X) || X <- L];
                         _ -> L
                     end,
              ?assertEqual(Want, Back)
      end, Cases),
    %% little-endian, as the worker reads it
    ?assertEqual({ok, <<1, 0, 0, 0, 255, 255, 255, 255>>}, erlcuda_vector:pack(i32, [1, -1])),
    ?assertEqual({ok, <<0, 0, 0, 0, 0, 0, 240, 63>>}, erlcuda_vector:pack(f64, [1.0])).

pack_range_errors_test() ->
    Bad = [{i32, [2147483648]}, {i32, [-2147483649]}, {u32, [-1]}, {u32, [4294967296]},
           {i64, [1 bsl 63]}, {u8, [256]}, {u8, [-1]}, {u8, [1.0]}, {i32, [2.5]},
           {f32, [1.0e39]}, {f32, [foo]}, {f64, [foo]}, {f64, [1 bsl 1100]},
           {i32, [1 | 2]}],
    [?assertMatch({error, _}, erlcuda_vector:pack(T, L)) || {T, L} <- Bad],
    {error, Why} = erlcuda_vector:pack(u8, [1, 2, 300]),
    ?assertEqual(<<"300 is outside the u8 range">>, iolist_to_binary(Why)).

%% f32 and f64 lists are packed eight elements a step: the same bytes as one at a time, at
%% every length and position (integers among the floats), and the same errors for an
%% element anywhere in a step of eight, in the tail after the last, or across the binaries
%% of 4096 elements they are built in.
pack_by_eights_test() ->
    [begin
         L = [case I rem 3 of 0 -> I; _ -> I * 0.5 end || I <- lists:seq(1, N)],
         ?assertEqual({ok, << <<X:32/float-little>> || X <- L >>}, erlcuda_vector:pack(f32, L)),
         ?assertEqual({ok, << <<X:64/float-little>> || X <- L >>}, erlcuda_vector:pack(f64, L)),
         ?assertEqual({ok, [float(X) || X <- L]},
                      erlcuda_vector:unpack(f32, << <<X:32/float-little>> || X <- L >>))
     end || N <- [0, 1, 7, 8, 9, 16, 17, 1000, 4095, 4096, 4097, 8200, 20000]],
    Ok = lists:duplicate(5000, 1.5),
    [begin
         At = lists:sublist(Ok, P) ++ [Bad | lists:nthtail(P, Ok)],
         ?assertEqual({T, P, Why}, {T, P, reason(erlcuda_vector:pack(T, At))})
     end || P <- [0, 3, 8, 13, 4095, 4096, 4100, 5000],
            {T, Bad, Why} <- [{f32, 1.0e39, <<"a number outside the f32 range">>},
                              {f32, -1.0e39, <<"a number outside the f32 range">>},
                              {f32, foo, <<"not a number: foo">>},
                              {f64, foo, <<"not a number: foo">>},
                              {f64, 1 bsl 1100, <<"a number outside the f64 range">>}]],
    [?assertEqual({T, <<"not a proper list">>}, {T, reason(erlcuda_vector:pack(T, Ok ++ 2.0))})
     || T <- [f32, f64]],
    Inf = <<0, 0, 128, 127>>,
    [?assertMatch({error, {non_finite, _}},
                  erlcuda_vector:unpack(f32, <<(binary:copy(<<1.5:32/float-little>>, P))/binary,
                                               Inf/binary, 0:32>>))
     || P <- [0, 3, 8, 13, 20]].

reason({error, Why}) -> iolist_to_binary(Why).

%% pack_unranged/2 makes pack/2's bytes from any list pack/2 takes, and its errors but the
%% range's; a number beyond f32's range becomes an infinity there, which in_f32_range/1
%% finds wherever it lies, as pack/2 does.
pack_unranged_test() ->
    [begin
         L = [case I rem 3 of 0 -> I; _ -> I * 0.5 end || I <- lists:seq(1, N)],
         ?assertEqual(erlcuda_vector:pack(f32, L), erlcuda_vector:pack_unranged(f32, L)),
         ?assert(erlcuda_vector:in_f32_range(L))
     end || N <- [0, 1, 7, 8, 9, 1000, 4095, 4096, 4097, 8200]],
    Ok = lists:duplicate(5000, 1.5),
    [begin
         At = lists:sublist(Ok, P) ++ [Big | lists:nthtail(P, Ok)],
         {ok, Bin} = erlcuda_vector:pack_unranged(f32, At),
         <<_:P/binary-unit:32, Inf:32/little, _/binary>> = Bin,
         ?assertEqual({P, Big, 16#7F800000}, {P, Big, Inf band 16#7FFFFFFF}),
         ?assertNot(erlcuda_vector:in_f32_range(At)),
         ?assertEqual(<<"a number outside the f32 range">>, reason(erlcuda_vector:pack(f32, At)))
     end || P <- [0, 3, 8, 13, 4095, 4096, 4100, 5000], Big <- [1.0e39, -1.0e39, 1 bsl 200]],
    ?assert(erlcuda_vector:in_f32_range([3.4028234663852886e38, -3.4028234663852886e38])),
    ?assertEqual(<<"a number outside the f32 range">>,
                 reason(erlcuda_vector:pack_unranged(f32, [1.0, 1 bsl 1100]))),
    ?assertEqual(<<"not a number: foo">>,
                 reason(erlcuda_vector:pack_unranged(f32, Ok ++ [foo]))),
    ?assertEqual(<<"not a proper list">>, reason(erlcuda_vector:pack_unranged(f32, Ok ++ 2.0))),
    ?assertEqual(erlcuda_vector:f32_range_error(),
                 binary_to_list(reason(erlcuda_vector:pack(f32, [1.0e39])))).

unpack_non_finite_test() ->
    Inf32 = <<0, 0, 128, 127>>,
    Inf64 = <<0, 0, 0, 0, 0, 0, 240, 127>>,
    ?assertMatch({error, {non_finite, _}}, erlcuda_vector:unpack(f32, Inf32)),
    ?assertMatch({error, {non_finite, _}}, erlcuda_vector:unpack(f64, Inf64)),
    %% the same bits are ordinary integers
    ?assertEqual({ok, [2139095040]}, erlcuda_vector:unpack(u32, Inf32)),
    ?assertEqual({ok, [0, 0, 128, 127]}, erlcuda_vector:unpack(u8, Inf32)).

scalar_test() ->
    ?assertEqual({ok, <<1.5:32/float-little, 0:32>>}, erlcuda_vector:scalar(f32, 1.5)),
    ?assertEqual({ok, <<-3:64/signed-little>>}, erlcuda_vector:scalar(i64, -3)),
    ?assertEqual({ok, <<200, 0:56>>}, erlcuda_vector:scalar(u8, 200)),
    ?assertEqual({ok, <<2.0:64/float-little>>}, erlcuda_vector:scalar(f64, 2)),
    ?assertMatch({error, _}, erlcuda_vector:scalar(u8, 256)),
    ?assertMatch({error, _}, erlcuda_vector:scalar(i32, 1.0)).
