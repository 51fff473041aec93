%% User kernels on the cpu backend: the source is built for the host (with g++), and runs
%% there. The cases every backend runs alike (erlcuda_usercode_cases, which
%% erlcuda_usercode_gpu_tests runs on a GPU), what the cpu backend refuses (with the
%% feature named), the checks of declarations and options, a load that does not block the
%% port owner, and the catalogue's modules loaded again into a new worker.
-module(erlcuda_usercode_tests).

-include_lib("eunit/include/eunit.hrl").

-export([log/2]).

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}]).

-define(SCALE, <<"extern \"C\" __global__ void scale(float *x, float a, long long n) {\n"
                 "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                 "  if (i < n) x[i] *= a;\n"
                 "}\n">>).

usercode_test_() ->
    erlcuda_test_util:with_app(
      ?DEFAULTS, [],
      [{"what the cpu backend cannot run is backend_unavailable, naming it",
        {timeout, 120, fun refused/0}},
       {"declarations are checked before any compile", fun declarations/0},
       {"malformed declarations and options are errors, never exceptions",
        fun malformed/0},
       {"nvcc options off the allow-list are refused, naming the flag",
        {timeout, 120, fun refused_options/0}},
       {"info and kernels/0 answer while a load compiles", {timeout, 120, fun not_blocked/0}},
       {"a program's step whose kernel was unloaded or reloaded otherwise",
        {timeout, 120, fun program_step_kernel_changed/0}},
       {"the catalogue's modules are loaded again into a new worker",
        {timeout, 120, fun replay/0}},
       %% the cases of every backend, last: they leave their modules loaded
       {"raw kernels", {timeout, 120, fun erlcuda_usercode_cases:raw/0}},
       {"launch shapes", {timeout, 120, fun erlcuda_usercode_cases:shapes/0}},
       {"elementwise kernels", {timeout, 120, fun erlcuda_usercode_cases:elementwise/0}},
       {"a compile error: the compiler's log",
        {timeout, 120, fun erlcuda_usercode_cases:compile_error/0}},
       {"modules survive a worker restart",
        {timeout, 120, fun erlcuda_usercode_cases:replay/0}}]).

%% A block's threads run one after another on the cpu backend: a kernel that needs them to
%% run together is refused before it is compiled, with the feature, and nothing is loaded.
refused() ->
    Barrier = <<"extern \"C\" __global__ void smooth(float *x, int n) {\n"
                "  __shared__ float tile[256];\n"
                "  tile[threadIdx.x] = x[threadIdx.x];\n"
                "  __syncthreads();\n"
                "  x[threadIdx.x] = tile[(threadIdx.x + 1) % 256];\n"
                "}\n">>,
    {error, {backend_unavailable, Why}} =
        erlcuda:load(smoothing, Barrier, [{smooth, [{inout, f32}, {scalar, i32}]}]),
    ?assertMatch({match, _}, re:run(Why, "^kernel smooth uses __shared__ \\(shared memory, "
                                    "kernel.cu:2\\), __syncthreads \\(barriers, "
                                    "kernel.cu:4\\), which the cpu backend cannot run")),
    ?assertNotEqual(nomatch, binary:match(Why, <<"cuda backend">>)),
    {error, {backend_unavailable, Why2}} =
        erlcuda:elementwise(total, [{x, f32}], [{y, f32}], <<"y = atomicAdd(&y, x)">>),
    ?assertNotEqual(nomatch, binary:match(Why2, <<"atomicAdd (atomics">>)),
    ?assertEqual([], [M || M <- erlcuda_catalogue:modules(), M =:= smoothing orelse M =:= total]),
    ?assertEqual({error, {unknown_kernel, smooth}}, erlcuda:launch_sync(smooth, [[1.0], 1])),
    ?assertEqual({error, {unknown_kernel, total}}, erlcuda:launch_sync(total, [[1.0]])).

declarations() ->
    ?assertEqual({error, {already_loaded, vector_add}},
                 erlcuda:load(m, ?SCALE, [{vector_add, [{in, f32}]}])),
    ?assertEqual({error, {already_loaded, copy}},
                 erlcuda:elementwise(copy, [{x, f32}], [{y, f32}], <<"y = x">>)),
    ?assertMatch({error, {bad_args, _}}, erlcuda:load(m, ?SCALE, [{scale, [{in, f17}]}])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:load(m, <<>>, [{scale, []}])),
    ?assertMatch({error, {bad_args, _}},
                 erlcuda:elementwise(twice, [{x, f32}], [{x, f32}], <<"x = 2 * x">>)),
    ?assertEqual({error, {bad_option, {nvcc, "-O3"}}},
                 erlcuda:load(m, ?SCALE, [{scale, []}], [{nvcc, "-O3"}])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:unload("m")),
    ?assertEqual(ok, erlcuda:unload(never_loaded)).

%% An improper kernel, param or option list raised (bad_generator, function_clause) out
%% of load/3,4 and elementwise/4,5 instead of returning an error.
malformed() ->
    Deep = lists:foldl(fun(_, Acc) -> [Acc] end, {scale, [{in, f32}]}, lists:seq(1, 10000)),
    Ok = [{scale, [{inout, f32}, {scalar, f32}, {scalar, i64}]}],
    Kernels = [[{k, [{in, f32}]} | bad], [{k, [{in, f32} | bad]}], [{k, [{in, [f32]}]}],
               [{k, {in, f32}}], [{k, [[{in, f32}]]}], [{k, [{in, f32}], extra}], {k, []},
               k, [k], [[{k, []}]], <<"k">>, [{<<"k">>, []}], [{"k", []}], Deep, [Deep],
               [{k, [{in, f32}]}, {k2, [{out, f32}]} | {k3, []}], [{k, [{in, f32} | {}]}],
               [{k, [{scalar, {f32}}]}], [{k, lists:duplicate(300, {in, f32})}]],
    Opts = [[{options, [<<"-O3">>]} | x], [{timeout, 1000} | {options, []}],
            {options, [<<"-O3">>]}, [{options, [<<"-O3">> | x]}], [{options, <<"-O3">>}],
            [{options, [[[[<<"-O3">> | x]]]]}], [{options, [-1]}], [{options, [{x}]}],
            [{options, [[256]]}], [{options, [self()]}], [options], [{options}],
            [{timeout, -1}], [{timeout, 1.5}], [{timeout, 1 bsl 40}], [x | y], x, <<"x">>,
            #{options => x}, #{1 => 2}, [Deep], [{options, Deep}], [{options, [Deep]}]],
    Sources = [[<<"ext">> | bad], [1 | 2], [-1], [[[[[x]]]]], {source}, 42, self()],
    Loads = [{m, ?SCALE, K, []} || K <- Kernels]
        ++ [{m, ?SCALE, Ok, O} || O <- Opts]
        ++ [{m, S, Ok, []} || S <- Sources]
        ++ [{"m", ?SCALE, Ok, []}, {[m | x], ?SCALE, Ok, []}, {Deep, ?SCALE, Ok, []}],
    Vars = [[{x, f32} | bad], [{x, {scalar, f32}} | x], [{x, {scalar, [f32]}}],
            [{x, {vector, f32}}], [{x, f32, extra}], [x], x, [Deep], Deep, [[{x, f32}]],
            [{"x", f32}], [{x, f32}, {y, f32} | {z, f32}], lists:duplicate(300, {x, f32})],
    Elementwise = [{saxpy, I, [{z, f32}], <<"z = x">>, []} || I <- Vars]
        ++ [{saxpy, [{x, f32}], O, <<"z = x">>, []} || O <- Vars]
        ++ [{saxpy, [{x, f32}], [{z, f32}], S, []} || S <- Sources]
        ++ [{saxpy, [{x, f32}], [{z, f32}], <<"z = x">>, O} || O <- Opts]
        ++ [{"saxpy", [{x, f32}], [{z, f32}], <<"z = x">>, []},
            {Deep, [{x, f32}], [{z, f32}], <<"z = x">>, []}],
    Results = [{Args, catch_all(fun() -> erlcuda:load(M, S, K, O) end)}
               || {M, S, K, O} = Args <- Loads]
        ++ [{Args, catch_all(fun() -> erlcuda:load(M, S, K) end)}
            || {M, S, K, []} = Args <- Loads]
        ++ [{Args, catch_all(fun() -> erlcuda:elementwise(N, I, Out, Op, O) end)}
            || {N, I, Out, Op, O} = Args <- Elementwise]
        ++ [{Args, catch_all(fun() -> erlcuda:elementwise(N, I, Out, Op) end)}
            || {N, I, Out, Op, []} = Args <- Elementwise],
    ?assertEqual([], [{Args, R} || {Args, R} <- Results,
                                   not (is_tuple(R) andalso tuple_size(R) =:= 2
                                        andalso element(1, R) =:= error)]),
    ?assertEqual([], erlcuda_catalogue:modules()).

catch_all(Fun) ->
    try Fun()
    catch Class:Reason -> {raised, Class, Reason}
    end.

%% nvcc ran the shell text of a -D value, and took -Xcompiler -oFILE or --keep-dir DIR. The
%% worker refuses every option that is not on its list before a compiler runs.
refused_options() ->
    Dir = filename:join(os:getenv("TMPDIR", "/tmp"),
                        "erlcuda-options-" ++ integer_to_list(erlang:unique_integer([positive]))),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    Marker = filename:join(Dir, "ran"),
    Shell = iolist_to_binary(["-DWIDTH=`touch ", Marker, "`"]),
    Kernels = [{scale, [{inout, f32}, {scalar, f32}, {scalar, i64}]}],
    Load = fun(Flags) -> erlcuda:load(m, ?SCALE, Kernels, [{options, Flags}]) end,
    Elementwise = fun(Flags) ->
                          erlcuda:elementwise(twice, [{x, f32}], [{y, f32}], <<"y = 2 * x">>,
                                              [{options, Flags}])
                  end,
    try
        ?assertEqual({error, {bad_option, {options, Shell}}}, Load(["-O3", Shell])),
        ?assertEqual({error, {bad_option, {options, <<"-Xcompiler">>}}},
                     Load([<<"-Xcompiler">>, ["-o", Marker]])),
        ?assertEqual({error, {bad_option, {options, <<"-ccbin">>}}}, Load(["-ccbin", Dir])),
        ?assertEqual({error, {bad_option, {options, Shell}}}, Elementwise([Shell])),
        ?assertEqual({error, {bad_option, {options, <<"--keep">>}}},
                     Elementwise(["--keep", "--keep-dir", Dir])),
        ?assertEqual({ok, []}, file:list_dir(Dir)),
        ?assertNot(lists:member(m, erlcuda_catalogue:modules())),
        %% the allowed ones reach the compiler (g++ takes what it has a meaning for)
        ?assertEqual(ok, Load(["-DWIDTH=4", <<"-O3">>, "--use_fast_math"])),
        ?assertEqual({ok, [[4.0, 6.0]]}, erlcuda:launch_sync(scale, [[2.0, 3.0], 2.0, 2])),
        ok = erlcuda:unload(m)
    after
        file:del_dir_r(Dir)
    end.

%% A load takes a while (a compiler runs): the port owner, info/0 (which waits 2 s at most
%% for a busy worker) and the catalogue's readers do not wait for it.
not_blocked() ->
    Self = self(),
    %% a source not cached yet (compiled code is cached by its preprocessed text, which has
    %% no comments), of many kernels, seconds of g++; the cache outlives the node, and
    %% unique_integer/1 counts the same way in every new node, so the name is drawn at random
    Source = iolist_to_binary(
               [io_lib:format("__device__ int erlcuda_unique_~b;\n",
                              [rand:uniform(1 bsl 62)]),
                [io_lib:format("extern \"C\" __global__ void k~b(float *x, int n) {\n"
                               "  for (int i = 0; i < n; i++) x[i] = sinf(x[i]) * ~b.0f;\n}\n",
                               [I, I]) || I <- lists:seq(1, 1500)]]),
    L0 = erlang:monotonic_time(millisecond),
    Pid = spawn(fun() -> Self ! {loaded, erlcuda:load(slow, Source, [{k1, [{inout, f32},
                                                                           {scalar, i32}]}])}
                end),
    timer:sleep(100),
    _ = erlcuda:kernels(),
    {ok, _} = erlcuda:launch_sync(reduce, [[1.0]]),
    #{backend := cpu} = erlcuda:info(),
    %% All three were answered while g++ still compiled.
    Meanwhile = receive {loaded, _} = Early -> self() ! Early, done after 0 -> running end,
    ?assertEqual(running, Meanwhile),
    receive {loaded, R} -> ?assertEqual(ok, R)
    after 110000 -> exit(Pid, kill), error(load_hung)
    end,
    ?debugFmt("the load took ~b ms", [erlang:monotonic_time(millisecond) - L0]),
    ?assertEqual({ok, [[0.0]]}, erlcuda:launch_sync(k1, [[0.0], 1])),
    ok = erlcuda:unload(slow).

%% Modules put into the catalogue as if a worker had loaded them, which this worker has not:
%% launches of their kernels are checked on this side and answered by the worker. A new
%% worker gets a load call for each before it is published: one the cpu backend runs is
%% loaded (its kernel launches at once), one it cannot run is answered backend_unavailable,
%% which the port owner logs; the catalogue keeps both.
replay() ->
    {ok, D, _} = erlcuda_loader:declare_elementwise(twice, [{x, f32}], [{y, f32}],
                                                       <<"y = 2 * x">>, []),
    ok = erlcuda_catalogue:commit(D),
    {ok, Racy, _} = erlcuda_loader:declare_elementwise(racy, [{x, f32}], [{y, f32}],
                                                          <<"y = atomicAdd(&y, x)">>, []),
    ok = erlcuda_catalogue:commit(Racy),
    ?assertEqual([racy, twice], lists:sort(erlcuda_catalogue:modules())),
    ?assert(lists:member(twice, [N || #{name := N} <- erlcuda:kernels()])),
    %% checked on this side first
    ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(twice, [[1.0], [2.0]])),
    %% the worker has no such kernel: one error reply
    ?assertMatch({error, _}, erlcuda:launch_sync(twice, [[1.0, 2.0]])),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        #{worker_os_pid := Os} = erlcuda:info(),
        os:cmd("kill -9 " ++ integer_to_list(Os)),
        erlcuda_test_util:wait_restarted(Os, 200),
        %% the replay was answered before the worker was published
        Replayed = receive {logged, Text} -> Text after 0 -> error(no_replay) end,
        ?assertNotEqual(nomatch, string:find(Replayed, "racy")),
        ?assertNotEqual(nomatch, string:find(Replayed, "atomicAdd")),
        ?assertEqual({ok, [2.0, 4.0]}, erlcuda:launch_sync(twice, [[1.0, 2.0]])),
        ?assertEqual([racy, twice], lists:sort(erlcuda_catalogue:modules())),
        ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]))
    after
        logger:remove_handler(?MODULE)
    end,
    [ok = erlcuda:unload(M) || M <- [twice, racy]],
    ?assertEqual([], erlcuda_catalogue:modules()),
    ?assertEqual({error, {unknown_kernel, twice}}, erlcuda:launch_sync(twice, [[1.0]])).

%% A program checks its steps' kernels at each run: one unloaded since is named as the
%% definition names it (an atom, as every `unknown_kernel'), and one reloaded with other
%% parameters is refused by its step's check.
program_step_kernel_changed() ->
    Ax = fun(Params) -> erlcuda:elementwise(ax_step, Params, [{z, f32}], <<"z = a * x">>) end,
    ok = Ax([{a, {scalar, f32}}, {x, f32}]),
    {ok, P} = erlcuda:program(#{inputs => [a, x], steps => [{z, ax_step, [a, x]}],
                                outputs => z}),
    ?assertEqual({ok, [2.0, 4.0]}, erlcuda:run_sync(P, [2.0, [1.0, 2.0]])),
    ok = erlcuda:unload(ax_step),
    ?assertEqual({error, {step, 1, {unknown_kernel, ax_step}}},
                 erlcuda:run_sync(P, [2.0, [1.0, 2.0]])),
    ok = Ax([{x, f32}, {a, f32}]),
    ?assertMatch({error, {step, 1, {bad_args, _}}}, erlcuda:run_sync(P, [2.0, [1.0, 2.0]])),
    ok = erlcuda:unload(ax_step).

%% A logger handler: the port owner's replay reports, to the test.
log(#{msg := {Fmt, Args}}, #{config := #{pid := Pid}}) when is_list(Fmt) ->
    case string:find(Fmt, "into the new worker") of
        nomatch -> ok;
        _ -> Pid ! {logged, lists:flatten(io_lib:format(Fmt, Args))}
    end;
log(_, _) ->
    ok.
