%% User kernels on the CPU backend: what a machine without a GPU can check. nvcc exists on
%% the build machine: a source is compiled (a bad one is `{compile, Log}') before the cpu
%% backend says it runs no user code. The catalogue keeps what was declared across a worker
%% restart, and the port owner loads it into the new worker before publishing it.
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
      [{"no GPU: backend_unavailable", {timeout, 120, fun unavailable/0}},
       {"a bad source: nvcc's log", {timeout, 120, fun compile_error/0}},
       {"declarations are checked before any compile", fun declarations/0},
       {"malformed declarations and options are errors, never exceptions",
        fun malformed/0},
       {"nvcc options off the allow-list are refused, naming the flag",
        {timeout, 120, fun refused_options/0}},
       {"info and kernels/0 answer while a load compiles", {timeout, 120, fun not_blocked/0}},
       {"loaded modules are loaded again into a new worker", {timeout, 120, fun replay/0}}]).

nvcc() ->
    os:find_executable("nvcc") =/= false orelse
        filelib:is_regular(filename:join([os:getenv("CUDA_HOME", "/nonexistent"), "bin",
                                          "nvcc"])).

unavailable() ->
    ?assertMatch({error, {backend_unavailable, _}},
                 erlcuda:load(my_kernels, ?SCALE,
                              [{scale, [{inout, f32}, {scalar, f32}, {scalar, i64}]}])),
    ?assertMatch({error, {backend_unavailable, _}},
                 erlcuda:elementwise(saxpy, [{a, {scalar, f32}}, {x, f32}, {y, f32}],
                                     [{z, f32}], <<"z = a * x + y">>)),
    %% nothing was loaded: the kernels are unknown
    ?assertEqual([], erlcuda_catalogue:modules()),
    ?assertEqual({error, {unknown_kernel, saxpy}}, erlcuda:launch_sync(saxpy, [1.0, [1.0], [1.0]])),
    ?assertEqual({error, {unknown_kernel, scale}}, erlcuda:launch(scale, [[1.0], 2.0, 1])),
    ?assertNot(lists:member(saxpy, [N || #{name := N} <- erlcuda:kernels()])),
    %% the worker knows none either
    ?assertMatch(#{modules := []}, erlcuda:info()),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]])).

compile_error() ->
    Bad = <<"extern \"C\" __global__ void k(float *x) { x[0] = 1 }\n">>,
    case nvcc() of
        true ->
            {error, {compile, Log}} = erlcuda:load(bad, Bad, [{k, [{out, f32}]}]),
            ?assert(is_binary(Log)),
            ?assertNotEqual(nomatch, binary:match(Log, <<"error">>)),
            {error, {compile, Log2}} = erlcuda:elementwise(bad_op, [{x, f32}], [{y, f32}],
                                                           <<"y = x +* ;">>),
            ?assert(is_binary(Log2));
        false ->
            ?debugMsg("no nvcc here: the compile error is not checked"),
            ?assertMatch({error, {backend_unavailable, _}},
                         erlcuda:load(bad, Bad, [{k, [{out, f32}]}]))
    end,
    ?assertEqual([], erlcuda_catalogue:modules()).

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
%% worker refuses every option that is not on its list before nvcc runs.
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
        %% the allowed ones reach nvcc (then the cpu backend runs no user code)
        ?assertMatch({error, {backend_unavailable, _}},
                     Load(["-DWIDTH=4", <<"-O3">>, "--use_fast_math"])),
        ?assertEqual([], erlcuda_catalogue:modules())
    after
        file:del_dir_r(Dir)
    end.

%% A load takes seconds (nvcc): the port owner, info/0 and the catalogue's readers do not
%% wait for it.
not_blocked() ->
    Self = self(),
    %% a source nvcc has not cached (compiled code is cached by its preprocessed text, which
    %% has no comments), of many kernels; the cache outlives the node, and unique_integer/1
    %% counts the same way in every new node, so the name is drawn at random
    Source = iolist_to_binary(
               [io_lib:format("__device__ int erlcuda_unique_~b;\n",
                              [rand:uniform(1 bsl 62)]),
                [io_lib:format("extern \"C\" __global__ void k~b(float *x, int n) {\n"
                               "  for (int i = 0; i < n; i++) x[i] = sinf(x[i]) * ~b.0f;\n}\n",
                               [I, I]) || I <- lists:seq(1, 200)]]),
    L0 = erlang:monotonic_time(millisecond),
    Pid = spawn(fun() -> Self ! {loaded, erlcuda:load(slow, Source, [{k1, [{inout, f32},
                                                                           {scalar, i32}]}])}
                end),
    timer:sleep(100),
    _ = erlcuda:kernels(),
    {ok, _} = erlcuda:launch_sync(reduce, [[1.0]]),
    #{backend := cpu} = erlcuda:info(),
    %% All three were answered while nvcc still compiled (where there is one: without it
    %% the load fails at once).
    Meanwhile = receive {loaded, _} = Early -> self() ! Early, done after 0 -> running end,
    ?assertEqual(running, case os:find_executable("nvcc") of
                              false -> running;
                              _ -> Meanwhile
                          end),
    receive {loaded, R} ->
            ?assertMatch({error, {Why, _}} when Why =:= backend_unavailable;
                                                Why =:= compile, R)
    after 110000 -> exit(Pid, kill), error(load_hung)
    end,
    ?debugFmt("the load took ~b ms", [erlang:monotonic_time(millisecond) - L0]).

%% What the cpu backend allows: a module put into the catalogue as if a GPU worker had
%% loaded it. A new worker gets a load call for it before it is published (here answered
%% backend_unavailable, which the port owner logs), the catalogue keeps it, and launches of
%% its kernel are checked on this side and answered by the worker.
replay() ->
    {ok, D, _} = erlcuda_loader:declare_elementwise(twice, [{x, f32}], [{y, f32}],
                                                       <<"y = 2 * x">>, []),
    ok = erlcuda_catalogue:commit(D),
    ?assertEqual([twice], erlcuda_catalogue:modules()),
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
        ?assertNotEqual(nomatch, string:find(Replayed, "twice")),
        ?assertEqual([twice], erlcuda_catalogue:modules()),
        ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]))
    after
        logger:remove_handler(?MODULE)
    end,
    ok = erlcuda:unload(twice),
    ?assertEqual([], erlcuda_catalogue:modules()),
    ?assertEqual({error, {unknown_kernel, twice}}, erlcuda:launch_sync(twice, [[1.0]])).

%% A logger handler: the port owner's replay reports, to the test.
log(#{msg := {Fmt, Args}}, #{config := #{pid := Pid}}) when is_list(Fmt) ->
    case string:find(Fmt, "into the new worker") of
        nomatch -> ok;
        _ -> Pid ! {logged, lists:flatten(io_lib:format(Fmt, Args))}
    end;
log(_, _) ->
    ok.
