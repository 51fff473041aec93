%% The checks of a launch (erlcuda_job:validate/3) without a worker: built-in kernels in
%% f32 and f64, options, buffers as operands, the general kernels, and the declarations of
%% user kernels (erlcuda_loader) with the launches checked against them.
-module(erlcuda_job_tests).

-include_lib("eunit/include/eunit.hrl").

-define(B(Node, Epoch, Device, Id, Type, N), {erlcuda_buffer, Node, Epoch, Device, Id, Type, N}).

%% A launch of a built-in kernel in f32, with no buffers or options: f32 operands and no
%% general part.
plain_launch_test() ->
    {ok, Job} = erlcuda_job:validate(vector_add, [[1.0, 2.0], <<3.0:32/float-little,
                                                                4.0:32/float-little>>], []),
    ?assertEqual(#{kernel => vector_add, device => 0, format => list, timeout => 5000,
                   trace => false, result_bytes => 8, expect => {vector, f32, 2},
                   args => [<<1.0:32/float-little, 2.0:32/float-little>>,
                            <<3.0:32/float-little, 4.0:32/float-little>>]}, Job),
    {ok, M} = erlcuda_job:validate(matmul, [[1, 2], [3, 4], 1, 1, 2], #{device => any}),
    ?assertEqual([<<1.0:32/float-little, 2.0:32/float-little>>,
                  <<3.0:32/float-little, 4.0:32/float-little>>, 1, 1, 2], maps:get(args, M)),
    ?assertNot(maps:is_key(general, M)).

%% validate/4 with `later': a built-in f32 launch's lists packed without their range check
%% and named for in_range/1, which says what validate/3 says; binaries, other types and
%% user kernels are as validate/3 makes them.
range_later_test() ->
    Args = [[1.0, 1.0e39], <<3.0:32/float-little, 4.0:32/float-little>>],
    {error, Now} = erlcuda_job:validate(vector_add, Args, []),
    {ok, Job} = erlcuda_job:validate(vector_add, Args, [], later),
    ?assertEqual([{<<"A">>, [1.0, 1.0e39]}], maps:get(unranged, Job)),
    {Unranged, Sent} = erlcuda_job:take_unranged(Job),
    ?assertNot(maps:is_key(unranged, Sent)),
    ?assertEqual({error, Now}, erlcuda_job:in_range(Unranged)),
    ?assertEqual({error, {bad_args, <<"A: a number outside the f32 range">>}},
                 erlcuda_job:in_range(Unranged)),
    {ok, Fine} = erlcuda_job:validate(vector_add, [[1.0, 2.0], [3, 4.0]], [], later),
    {ok, Plain} = erlcuda_job:validate(vector_add, [[1.0, 2.0], [3, 4.0]], []),
    {FineLists, FineSent} = erlcuda_job:take_unranged(Fine),
    ?assertEqual(Plain, FineSent),
    ?assertEqual([<<"A">>, <<"B">>], [N || {N, _} <- FineLists]),
    ?assertEqual(ok, erlcuda_job:in_range(FineLists)),
    {ok, F64} = erlcuda_job:validate(vector_add, [[1.0e300, 2.0], [3, 4]], [{type, f64}],
                                     later),
    ?assertEqual({[], F64}, erlcuda_job:take_unranged(F64)),
    ?assertEqual(erlcuda_job:validate(vector_add, [[1.0, foo], [3, 4]], []),
                 erlcuda_job:validate(vector_add, [[1.0, foo], [3, 4]], [], later)),
    ?assertEqual({[], Plain}, erlcuda_job:take_unranged(Plain)),
    %% both beyond the range: the first argument is named, as validate/3 names it
    {ok, Both} = erlcuda_job:validate(vector_add, [[1.0e39], [2.0e39]], [], later),
    ?assertEqual(erlcuda_job:validate(vector_add, [[1.0e39], [2.0e39]], []),
                 erlcuda_job:in_range(maps:get(unranged, Both))),
    %% refused at once, it is refused as validate/3 refuses it (a range before a length)
    ?assertEqual(erlcuda_job:validate(vector_add, [[1.0e39], [1.0, 2.0]], []),
                 erlcuda_job:validate(vector_add, [[1.0e39], [1.0, 2.0]], [], later)).

f64_launch_test() ->
    {ok, Job} = erlcuda_job:validate(vector_add, [[1, 2], [3.5, 4]], [{type, f64}]),
    ?assertEqual([{vector, f64, <<1.0:64/float-little, 2.0:64/float-little>>},
                  {vector, f64, <<3.5:64/float-little, 4.0:64/float-little>>}],
                 maps:get(args, Job)),
    %% no shared-memory result file for a type other than f32
    ?assertEqual(0, maps:get(result_bytes, Job)),
    ?assertNot(maps:is_key(general, Job)),
    ?assertMatch({error, {bad_args, _}},
                 erlcuda_job:validate(vector_add, [[1], [2]], [{type, i32}])),
    ?assertMatch({error, {bad_args, _}},
                 erlcuda_job:validate(reduce, [<<1, 2, 3, 4>>], [{type, f64}])),
    ?assertEqual({error, {bad_option, {type, f16}}},
                 erlcuda_job:validate(reduce, [[1]], [{type, f16}])).

options_test() ->
    Bad = [{keep, yes}, {grid, 0}, {grid, {1, 2, 3, 4}}, {block, -1}, {shared, -1},
           {elements, -1}, {type, "f32"}],
    [?assertEqual({error, {bad_option, O}}, erlcuda_job:validate(reduce, [[1.0]], [O]))
     || O <- Bad],
    %% a launch shape is for user kernels
    [?assertEqual({error, {bad_option, O}}, erlcuda_job:validate(reduce, [[1.0]], [O]))
     || O <- [{grid, 2}, {block, {32, 2}}, {shared, 0}, {elements, 10}]],
    {ok, K} = erlcuda_job:validate(vector_add, [[1.0], [2.0]], [{keep, true}]),
    ?assertEqual(#{keep => 1, buffers => [], shape => value}, maps:get(general, K)),
    ?assertEqual(0, maps:get(result_bytes, K)),
    %% a scalar result keeps nothing
    {ok, R} = erlcuda_job:validate(reduce, [[1.0]], [{keep, true}]),
    ?assertNot(maps:is_key(general, R)).

buffers_test() ->
    A = ?B(node(), 3, 1, 10, f64, 2),
    B = ?B(node(), 3, 1, 11, f64, 2),
    {ok, Job} = erlcuda_job:validate(vector_add, [A, [1, 2]], []),
    %% the launch runs in its buffers' type, on their device
    ?assertEqual([{handle, 10}, {vector, f64, <<1.0:64/float-little, 2.0:64/float-little>>}],
                 maps:get(args, Job)),
    ?assertEqual(1, maps:get(device, Job)),
    ?assertEqual(#{keep => 0, buffers => [A], shape => value}, maps:get(general, Job)),
    {ok, J2} = erlcuda_job:validate(vector_add, [A, B], [{device, any}]),
    ?assertEqual(1, maps:get(device, J2)),
    ?assertEqual({error, {wrong_device, A}},
                 erlcuda_job:validate(vector_add, [A, B], [{device, 0}])),
    C = ?B(node(), 3, 0, 12, f64, 2),
    ?assertEqual({error, {wrong_device, C}}, erlcuda_job:validate(vector_add, [A, C], [])),
    Remote = ?B('other@nowhere', 3, 1, 10, f64, 2),
    ?assertEqual({error, {remote_buffer, Remote}},
                 erlcuda_job:validate(reduce, [Remote], [])),
    %% the first buffer sets the type; another type is refused
    F = ?B(node(), 3, 1, 13, f32, 2),
    ?assertMatch({error, {bad_args, _}}, erlcuda_job:validate(vector_add, [A, F], [])),
    ?assertMatch({error, {bad_args, _}},
                 erlcuda_job:validate(vector_add, [A, [1.0]], [])),
    %% lengths come from the handle
    ?assertMatch({error, {bad_args, _}},
                 erlcuda_job:validate(matmul, [A, B, 1, 1, 1], [])),
    {ok, _} = erlcuda_job:validate(matmul, [A, B, 1, 1, 2], []),
    %% a tuple that is no buffer is bad data
    ?assertMatch({error, {bad_args, _}},
                 erlcuda_job:validate(reduce, [{erlcuda_buffer, x}], [])).

general_kernels_test() ->
    {ok, Z} = erlcuda_job:validate(zeros, [4], [{type, i32}, {keep, true}]),
    ?assertEqual([{empty, i32, 4}], maps:get(args, Z)),
    ?assertEqual(1, maps:get(keep, maps:get(general, Z))),
    {ok, C} = erlcuda_job:validate(copy, [[1, 2, 3]], [{type, u8}]),
    ?assertEqual([{vector, u8, <<1, 2, 3>>}], maps:get(args, C)),
    {ok, D} = erlcuda_job:validate(copy, [[1.0]], []),
    ?assertEqual([<<1.0:32/float-little>>], maps:get(args, D)),
    ?assertMatch({error, {bad_args, _}}, erlcuda_job:validate(zeros, [-1], [])).

%%% Declarations of user kernels (erlcuda_loader), and launches checked against them.

declare_test() ->
    Src = <<"extern \"C\" __global__ void k(float *x, int n) {}">>,
    {ok, D, 120000} = erlcuda_loader:declare(m, Src, [{k, [{inout, f32}, {scalar, i32}]}],
                                                []),
    ?assertEqual({load, [<<"m">>, Src, [], [{<<"k">>, [{inout, f32}, {scalar, i32}]}]]},
                 maps:get(call, D)),
    #{k := Spec} = maps:get(specs, D),
    ?assertMatch(#{user := raw, module := m, general := true,
                   params := [#{kind := vector, type := f32, access := inout},
                              #{kind := scalar, type := i32}]}, Spec),
    {ok, D2, 5000} = erlcuda_loader:declare(m, ["ext", <<"ern">>], [{k, []}],
                                               [{options, ["-O3", <<"-lineinfo">>]},
                                                {timeout, 5000}]),
    ?assertMatch({load, [_, <<"extern">>, [<<"-O3">>, <<"-lineinfo">>], _]}, maps:get(call, D2)),
    Bad = [{"m", Src, [{k, []}], []},
           {m, <<>>, [{k, []}], []},
           {m, [foo], [{k, []}], []},
           {m, Src, [], []},
           {m, Src, [{k, []}, {k, []}], []},
           {m, Src, [{'not an identifier', []}], []},
           {m, Src, [{k, [{in, f16}]}], []},
           {m, Src, [{k, [{read, f32}]}], []},
           {m, Src, [{k, lists:duplicate(256, {in, f32})}], []},
           {m, Src, not_a_list, []}],
    [?assertMatch({error, {bad_args, _}}, erlcuda_loader:declare(M, S, K, O))
     || {M, S, K, O} <- Bad],
    ?assertEqual({error, {bad_option, {colour, red}}},
                 erlcuda_loader:declare(m, Src, [{k, []}], [{colour, red}])),
    ?assertEqual({error, {bad_option, {timeout, 0}}},
                 erlcuda_loader:declare(m, Src, [{k, []}], [{timeout, 0}])).

declare_elementwise_test() ->
    {ok, D, _} = erlcuda_loader:declare_elementwise(
                   saxpy, [{a, {scalar, f32}}, {x, f32}, {y, f32}], [{z, f32}],
                   <<"z = a * x + y">>, []),
    ?assertEqual({elementwise, [<<"saxpy">>, [{<<"a">>, f32, scalar}, {<<"x">>, f32, vector},
                                              {<<"y">>, f32, vector}],
                                [{<<"z">>, f32}], <<"z = a * x + y">>, []]},
                 maps:get(call, D)),
    ?assertEqual(saxpy, maps:get(module, D)),
    ?assertMatch(#{saxpy := #{user := elementwise, outputs := [#{type := f32}]}},
                 maps:get(specs, D)),
    Bad = [{saxpy, [{x, f32}], [], <<"x">>},
           {saxpy, [{a, {scalar, f32}}], [{z, f32}], <<"z = a">>},
           {saxpy, [{x, f32}, {x, f32}], [{z, f32}], <<"z = x">>},
           {saxpy, [{x, f32}], [{x, f32}], <<"x = x">>},
           {saxpy, [{i, f32}], [{z, f32}], <<"z = i">>},
           {saxpy, [{x, f32}], [{n, f32}], <<"n = x">>},
           {saxpy, [{saxpy, f32}], [{z, f32}], <<"z = saxpy">>},
           {saxpy, [{x, f16}], [{z, f32}], <<"z = x">>},
           {saxpy, [{x, f32}], [{z, f32}], <<>>},
           {'2x', [{x, f32}], [{z, f32}], <<"z = x">>},
           {saxpy, not_a_list, [{z, f32}], <<"z">>}],
    [?assertMatch({error, {bad_args, _}},
                  erlcuda_loader:declare_elementwise(N, I, O, Op, []))
     || {N, I, O, Op} <- Bad].

%% A user kernel in the catalogue: its launches are checked here, without a worker.
user_kernels_test_() ->
    {setup,
     fun() ->
             Src = <<"extern \"C\" __global__ void k(float *x, double *y, int a) {}">>,
             {ok, Raw, _} = erlcuda_loader:declare(
                              mod, Src, [{k, [{in, f32}, {inout, f64}, {scalar, i32}]}], []),
             {ok, Ew, _} = erlcuda_loader:declare_elementwise(
                             ew, [{a, {scalar, f32}}, {x, f32}, {y, f32}], [{z, f32}, {w, i32}],
                             <<"z = a * x + y; w = 1">>, []),
             {ok, Ew1, _} = erlcuda_loader:declare_elementwise(
                              ew1, [{x, u8}], [{z, u8}], <<"z = x">>, []),
             [erlcuda_catalogue:commit(D) || D <- [Raw, Ew, Ew1]]
     end,
     fun(_) -> erlcuda_catalogue:reset() end,
     [fun raw_launch/0, fun elementwise_launch/0, fun kernels_listed/0]}.

raw_launch() ->
    {ok, J} = erlcuda_job:validate(k, [[1.0, 2.0], 3, 7], []),
    ?assertEqual([<<1.0:32/float-little, 2.0:32/float-little>>, {empty, f64, 3},
                  {scalar, i32, <<7:32/little, 0:32>>}], maps:get(args, J)),
    %% no launch shape asked for: the worker's default (the longest vector)
    ?assertEqual(#{keep => 0, buffers => [], shape => list}, maps:get(general, J)),
    {ok, K} = erlcuda_job:validate(k, [[1.0], [1.0, 2.0], 7], [{keep, true}, {block, 128}]),
    ?assertEqual(#{keep => 1, buffers => [], shape => list,
                   geometry => {{1, 1, 1}, {128, 1, 1}, 0}}, maps:get(general, K)),
    {ok, G} = erlcuda_job:validate(k, [[], [], 0], [{grid, {2, 3}}, {block, {8, 8}},
                                                   {shared, 512}]),
    ?assertEqual({{2, 3, 1}, {8, 8, 1}, 512}, maps:get(geometry, maps:get(general, G))),
    {ok, E} = erlcuda_job:validate(k, [[], [], 0], [{elements, 1000}]),
    ?assertEqual({{4, 1, 1}, {256, 1, 1}, 0}, maps:get(geometry, maps:get(general, E))),
    %% a buffer of the param's type is used in place, and is not in the reply
    Y = ?B(node(), 1, 0, 5, f64, 2),
    {ok, B} = erlcuda_job:validate(k, [[1.0], Y, 1], [{keep, true}]),
    ?assertEqual([{handle, 5}], [A || {handle, _} = A <- maps:get(args, B)]),
    ?assertEqual(0, maps:get(keep, maps:get(general, B))),
    Bad = [[[1.0], 3],                         % arity
           [3, 3, 7],                          % a count for an `in' param
           [[1.0], -1, 7],
           [[1.0], 3, 1.5],                    % an i32 scalar
           [[1.0], 3, 1 bsl 31],
           [[1.0], ?B(node(), 1, 0, 5, f32, 2), 1],
           [[foo], 3, 7]],
    [?assertMatch({error, {bad_args, _}}, erlcuda_job:validate(k, A, [])) || A <- Bad],
    ?assertEqual({error, {bad_option, {grid, 0}}}, erlcuda_job:validate(k, [[1.0], 3, 7],
                                                                        [{grid, 0}])).

elementwise_launch() ->
    X = ?B(node(), 1, 1, 6, f32, 3),
    {ok, J} = erlcuda_job:validate(ew, [2, X, [1, 2, 3]], [{keep, true}]),
    ?assertEqual([{scalar, f32, <<2.0:32/float-little, 0:32>>}, {handle, 6},
                  <<1.0:32/float-little, 2.0:32/float-little, 3.0:32/float-little>>],
                 maps:get(args, J)),
    ?assertEqual(1, maps:get(device, J)),
    ?assertEqual(#{keep => 2, buffers => [X], shape => list}, maps:get(general, J)),
    {ok, J1} = erlcuda_job:validate(ew1, [[1, 2]], []),
    ?assertEqual(single, maps:get(shape, maps:get(general, J1))),
    ?assertMatch({error, {bad_args, _}}, erlcuda_job:validate(ew, [2, [1.0], [1.0, 2.0]], [])),
    ?assertMatch({error, {bad_args, _}}, erlcuda_job:validate(ew, [2, 3, [1.0]], [])),
    ?assertMatch({error, {bad_args, _}}, erlcuda_job:validate(ew1, [[256]], [])).

kernels_listed() ->
    Names = [N || #{name := N} <- erlcuda:kernels()],
    ?assertEqual([vector_add, reduce, dot_product, matmul, copy, zeros, empty, ew, ew1, k],
                 Names),
    ?assertEqual([ew, ew1, mod], erlcuda_catalogue:modules()),
    %% a kernel name belongs to one module and never to a built-in one
    ?assertMatch([{ew, elementwise, _}, {ew1, elementwise, _}, {mod, load, _}],
                 erlcuda_catalogue:replay()).
