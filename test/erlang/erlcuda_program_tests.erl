%% Programs on the CPU backend (two virtual devices): a definition's refusals, runs in every
%% shape (outputs, formats, types, buffers, numbers, kept outputs), a step's refusal named
%% by its index, many callers batched, and exactly one reply per run when its caller dies
%% or the worker goes down mid-run.
-module(erlcuda_program_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"},
                   {python_path, erlcuda_test_util:test_worker_path()},
                   {buffer_limit, infinity}, {max_queue, 10000}]).

%% A chain of Links vector_adds of a and b (a + b, then + b each), and its sum.
chain(Links) ->
    Names = [list_to_atom("s" ++ integer_to_list(I)) || I <- lists:seq(1, Links)],
    Steps = [{hd(Names), vector_add, [a, b]}
             | [{N, vector_add, [Prev, b]} || {Prev, N} <- lists:zip(lists:droplast(Names),
                                                                    tl(Names))]],
    #{name => chain, inputs => [a, b], steps => Steps ++ [{total, reduce, [lists:last(Names)]}],
      outputs => [total, lists:last(Names)]}.

program(Spec) ->
    {ok, P} = erlcuda:program(Spec),
    P.

bad(Spec) -> bad(Spec, []).

bad(Spec, Opts) ->
    {error, {bad_program, Text}} = erlcuda:program(Spec, Opts),
    ?assert(is_binary(Text)),
    Text.

definition_test_() ->
    One = fun(Steps, Outputs) -> #{inputs => [x], steps => Steps, outputs => Outputs} end,
    [{"a definition is a map of its fields", fun() ->
          bad(not_a_map),
          bad(#{inputs => [x], steps => [{t, reduce, [x]}]}),
          bad(#{inputs => [x], steps => [{t, reduce, [x]}], outputs => t, extra => 1}),
          bad(#{inputs => [x], steps => [{t, reduce, [x]}], outputs => t, name => "s"}),
          bad(#{inputs => x, steps => [{t, reduce, [x]}], outputs => t}),
          bad(#{inputs => [x | y], steps => [{t, reduce, [x]}], outputs => t}),
          bad(One([], t)),
          bad(One([{t, reduce, [x]}], [])),
          bad(One([{t, reduce, [x]}], t), [{fuse, maybe}]),
          bad(One([{t, reduce, [x]}], t), not_options)
      end},
     {"names are unique, and named before they are used", fun() ->
          bad(#{inputs => [x, x], steps => [{t, reduce, [x]}], outputs => t}),
          bad(One([{x, reduce, [x]}], x)),
          bad(One([{t, vector_add, [x, x]}, {t, reduce, [x]}], t)),
          ?assertMatch(<<_/binary>>, bad(One([{t, reduce, [y]}], t))),
          %% a step names only what comes before it: no cycle can be written
          Later = bad(One([{u, vector_add, [x, v]}, {v, vector_add, [x, x]}], u)),
          ?assertNotEqual(nomatch, binary:match(Later, <<"before it">>)),
          bad(One([{u, vector_add, [x, u]}], u))
      end},
     {"kernels, arity and each argument's kind", fun() ->
          bad(One([{t, no_such_kernel, [x]}], t)),
          bad(One([{t, copy, [x]}], t)),
          bad(One([{t, zeros, [4]}], t)),
          bad(One([{t, vector_add, [x]}], t)),
          bad(One([{t, vector_add, [x, x, x]}], t)),
          bad(One([{t, vector_add, [x, 2]}], t)),
          bad(One([{t, matmul, [x, x, 2, 2.5, 2]}], t)),
          bad(One([{t, matmul, [x, x, -1, 1, 1]}], t)),
          bad(One([{t, vector_add, [x, x]}, {u, matmul, [x, x, t, 1, 1]}], u)),
          bad(One([{t, reduce, [x]}, {u, vector_add, [t, x]}], u)),
          bad(One([{t, vector_add, [x, {erlcuda_buffer, x}]}], t)),
          %% an input is one kind of argument wherever it goes
          bad(#{inputs => [x, n], steps => [{t, matmul, [x, n, n, n, n]}], outputs => t}),
          bad(#{inputs => [{x, f32}, n], steps => [{t, matmul, [x, x, x, n, n]}], outputs => t}),
          bad(#{inputs => [{x, f99}], steps => [{t, reduce, [x]}], outputs => t})
      end},
     {"outputs are steps' results, every input is used", fun() ->
          bad(One([{t, reduce, [x]}], x)),
          bad(One([{t, reduce, [x]}], {t, 2})),
          bad(One([{t, reduce, [x]}], [t, nope])),
          bad(One([{t, reduce, [x]}], [t | t])),
          bad(#{inputs => [x, y], steps => [{t, reduce, [x]}], outputs => t}),
          ?assertMatch({ok, _}, erlcuda:program(One([{t, reduce, [x]}], [t, t, {t, 1}])))
      end},
     {"a program is a term to print and send", fun() ->
          P = program(chain(3)),
          ?assert(erlcuda_program:is_program(P)),
          ?assertEqual(P, binary_to_term(term_to_binary(P))),
          ?assertEqual(chain, erlcuda_program:name(P)),
          {ok, Same} = erlcuda:program(chain(3)),
          ?assertEqual(erlcuda_program:definition(P), erlcuda_program:definition(Same)),
          {ok, Plain} = erlcuda:program(chain(3), #{fuse => false, graph => false}),
          ?assertNotEqual(erlcuda_program:definition(P), erlcuda_program:definition(Plain))
      end},
     {"runs refuse what is not a program", fun() ->
          ?assertMatch({error, {bad_args, _}}, erlcuda:run(vector_add, [[1.0], [1.0]])),
          ?assertMatch({error, {bad_args, _}}, erlcuda:run_sync({erlcuda_program, #{}}, [])),
          %% a program term altered since it was made: an error, never an exception
          {ok, {erlcuda_program, M}} = erlcuda:program(chain(2)),
          [?assertMatch({error, {bad_args, _}},
                        erlcuda:run_sync({erlcuda_program, maps:merge(M, Change)}, [[1.0]]))
           || Change <- [#{inputs => foo}, #{inputs => [x | y]}, #{inputs => [{x, text}]},
                         #{baked => [{b, f16}]}, #{outputs => [matrix]}, #{shape => many},
                         #{name => "chain"}, #{outputs => [scalar]},
                         #{outputs => [vector, vector, vector]}, #{shape => list}]],
          %% and as a launch's kernel
          ?assertMatch({error, {bad_args, _}},
                       erlcuda:launch_sync({erlcuda_program, M#{outputs => [scalar]}},
                                           [[1.0]])),
          ?assertMatch({error, {bad_args, _}},
                       erlcuda:run({erlcuda_program, maps:remove(baked, M)}, [[1.0]]))
      end}].

runs_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [], [
        {"a chain answers its sum and its last vector", fun chain_run/0},
        {"one output alone, formats and element types", fun shapes/0},
        {"buffers as inputs, in steps, and kept outputs", fun buffers/0},
        {"numbers as inputs", fun numbers/0},
        {"a step's refusal names its index", fun refusals/0},
        {"run/3 answers once, as launch/3 does", fun async/0},
        {"many callers run one program", {timeout, 120, fun many_callers/0}},
        {"a caller that dies mid-run leaves nothing", {timeout, 60, fun caller_dies/0}},
        {"a worker that goes down answers every run once", {timeout, 120, fun worker_down/0}}]).

floats(N, K) -> [float((I * K) rem 17) || I <- lists:seq(1, N)].

plus(A, B) -> [X + Y || {X, Y} <- lists:zip(A, B)].

chain_of(A, B, Links) ->
    lists:foldl(fun(_, Acc) -> plus(Acc, B) end, A, lists:seq(1, Links)).

chain_run() ->
    P = program(chain(10)),
    A = floats(1000, 3), B = floats(1000, 5),
    Last = chain_of(A, B, 10),
    ?assertEqual({ok, [lists:sum(Last), Last]}, erlcuda:run_sync(P, [A, B])),
    %% the same through launch_sync, on device 1, and as binaries
    ?assertEqual({ok, [lists:sum(Last), Last]}, erlcuda:launch_sync(P, [A, B], [{device, 1}])),
    Bin = fun(L) -> << <<X:32/float-little>> || X <- L >> end,
    {ok, [Sum, LastBin]} = erlcuda:run_sync(P, [Bin(A), Bin(B)], [{format, binary}]),
    ?assertEqual({lists:sum(Last), Bin(Last)}, {Sum, LastBin}).

shapes() ->
    Sum = program(#{inputs => [x], steps => [{t, reduce, [x]}], outputs => t}),
    ?assertEqual({ok, 6.0}, erlcuda:run_sync(Sum, [[1.0, 2.0, 3.0]])),
    Pair = program(#{inputs => [x, y], steps => [{t, vector_add, [x, y]}], outputs => [t]}),
    ?assertEqual({ok, [[4.0, 6.0]]}, erlcuda:run_sync(Pair, [[1.0, 2.0], [3.0, 4.0]])),
    %% f64 through {type, T}, or fixed by the definition
    Tiny = 1.0e-300,
    ?assertEqual({ok, [[2.0 * Tiny]]}, erlcuda:run_sync(Pair, [[Tiny], [Tiny]], [{type, f64}])),
    Fixed = program(#{inputs => [{x, f64}, {y, f64}], steps => [{t, vector_add, [x, y]}],
                      outputs => t}),
    ?assertEqual({ok, [2.0 * Tiny]}, erlcuda:run_sync(Fixed, [[Tiny], [Tiny]])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:run_sync(Fixed, [[1.0], <<1:24>>])).

buffers() ->
    {ok, A} = erlcuda:upload([1.0, 2.0, 3.0]),
    {ok, B} = erlcuda:upload([10.0, 20.0, 30.0], [{device, 1}]),
    %% a buffer named in a step runs the program on its device
    AddA = program(#{inputs => [x], steps => [{t, vector_add, [x, A]}, {s, reduce, [t]}],
                     outputs => [s, t]}),
    ?assertEqual({ok, [9.0, [2.0, 3.0, 4.0]]}, erlcuda:run_sync(AddA, [[1.0, 1.0, 1.0]])),
    ?assertEqual({ok, [12.0, [2.0, 4.0, 6.0]]}, erlcuda:run_sync(AddA, [A])),
    ?assertMatch({error, {wrong_device, _}}, erlcuda:run_sync(AddA, [B])),
    {ok, [_, Kept]} = erlcuda:run_sync(AddA, [A], [{keep, true}]),
    ?assertMatch(#{type := f32, elements := 3, device := 0}, erlcuda:buffer_info(Kept)),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, erlcuda:download(Kept)),
    %% outputs kept are the caller's, and inputs are never written
    ?assertEqual({ok, [1.0, 2.0, 3.0]}, erlcuda:download(A)),
    ok = erlcuda:free(Kept),
    ok = erlcuda:free(A),
    ?assertMatch({error, {buffer_lost, _}}, erlcuda:run_sync(AddA, [[1.0, 1.0, 1.0]])),
    ok = erlcuda:free(B).

numbers() ->
    MM = program(#{inputs => [x, n], steps => [{t, matmul, [x, x, n, n, n]}], outputs => t}),
    ?assertEqual({ok, [7.0, 10.0, 15.0, 22.0]}, erlcuda:run_sync(MM, [[1.0, 2.0, 3.0, 4.0], 2])),
    ?assertEqual({ok, [1.0]}, erlcuda:run_sync(MM, [[1.0], 1])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:run_sync(MM, [[1.0], -1])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:run_sync(MM, [[1.0], 1.5])).

refusals() ->
    P = program(chain(3)),
    ?assertMatch({error, {step, 1, {bad_args, <<"length mismatch", _/binary>>}}},
                 erlcuda:run_sync(P, [[1.0, 2.0], [1.0]])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:run_sync(P, [[1.0]])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:run_sync(P, [[1.0], [a]])),
    ?assertMatch({error, {bad_option, _}}, erlcuda:run_sync(P, [[1.0], [1.0]], [{grid, 1}])),
    ?assertMatch({error, {bad_device, _}}, erlcuda:run_sync(P, [[1.0], [1.0]], [{device, 7}])),
    %% a step's element types follow the inputs: mixed types are the step's refusal (data
    %% takes the first buffer's type, as a launch's does, unless {type, T} says otherwise)
    {ok, F64} = erlcuda:upload([1.0], [{type, f64}]),
    ?assertMatch({ok, [4.0, [4.0]]}, erlcuda:run_sync(P, [F64, [1.0]])),
    ?assertMatch({error, {step, 1, {bad_args, _}}},
                 erlcuda:run_sync(P, [F64, [1.0]], [{type, f32}])),
    ok = erlcuda:free(F64).

async() ->
    P = program(chain(2)),
    {ok, Id} = erlcuda:run(P, [[1.0], [2.0]]),
    receive {erlcuda, Id, R} -> ?assertEqual({ok, [5.0, [5.0]]}, R)
    after 10000 -> error(no_reply)
    end,
    {ok, Id2} = erlcuda:run(P, [[1.0, 2.0], [2.0]]),
    receive {erlcuda, Id2, R2} -> ?assertMatch({error, {step, 1, _}}, R2)
    after 10000 -> error(no_reply)
    end,
    erlcuda_test_util:no_message().

many_callers() ->
    P = program(#{inputs => [a, b], steps => [{s, vector_add, [a, b]}, {t, vector_add, [s, b]},
                                              {u, reduce, [t]}], outputs => u}),
    Self = self(),
    Before = batches(),
    Pids = [spawn_link(fun() ->
                               A = floats(1000, I), B = floats(1000, I + 1),
                               Want = lists:sum(chain_of(A, B, 2)),
                               Self ! {done, self(), [erlcuda:run_sync(P, [A, B], [{timeout, 60000}])
                                                      =:= {ok, Want} || _ <- lists:seq(1, 20)]}
                       end) || I <- lists:seq(1, 200)],
    Results = lists:append([receive {done, Pid, R} -> R end || Pid <- Pids]),
    ?assertEqual(4000, length([ok || true <- Results])),
    %% runs of one program and shape ran together
    ?assert(batches() > Before).

%% The largest batch device 0 has run.
batches() ->
    #{device_info := [#{max_batch := Max} | _]} = erlcuda:info(),
    Max.

caller_dies() ->
    P = program(chain(5)),
    Before = owned(),
    %% device 0 busy: the runs wait in its queue while their callers die (run/3's callers
    %% say so once their run is queued; run_sync/3's just before)
    erlcuda_test_util:stall(0, 1000),
    Self = self(),
    Opts = [{keep, true}, {timeout, 60000}],
    Pids = [spawn(fun() ->
                          Inputs = [floats(1000, I), floats(1000, 2)],
                          case I rem 2 of
                              0 -> {ok, _} = erlcuda:run(P, Inputs, Opts),
                                   Self ! {sent, self()},
                                   receive never -> ok end;
                              1 -> Self ! {sent, self()},
                                   erlcuda:run_sync(P, Inputs, Opts)
                          end
                  end) || I <- lists:seq(1, 100)],
    [receive {sent, Pid} -> ok end || Pid <- Pids],
    [exit(Pid, kill) || Pid <- Pids],
    erlcuda_test_util:flush_stalled(),
    ok = erlcuda_test_util:wait_until(fun() -> owned() =:= Before end, 300).

owned() ->
    #{owned_buffers := Owned, device_info := Devices} = erlcuda:info(),
    {Owned, [maps:get(buffers, D) || D <- Devices]}.

worker_down() ->
    P = program(chain(5)),
    #{worker_os_pid := Os} = erlcuda:info(),
    erlcuda_test_util:stall(0, 3000),
    Ids = [begin {ok, Id} = erlcuda:run(P, [floats(100, I), floats(100, 2)]), Id end
           || I <- lists:seq(1, 50)],
    erlcuda_test_util:kill9(Os),
    Replies = [receive {erlcuda, Id, R} -> R after 30000 -> no_reply end || Id <- Ids],
    ?assertEqual([], [R || R <- Replies, element(1, R) =/= error]),
    ?assertEqual([], [R || R <- Replies, element(1, element(2, R)) =/= worker_down]),
    erlcuda_test_util:flush_stalled(),
    erlcuda_test_util:wait_restarted(Os, 300),
    timer:sleep(200),
    erlcuda_test_util:no_message(),
    ?assertMatch({ok, [_, _]}, erlcuda:run_sync(P, [[1.0], [1.0]])).
