%% Clustering on the CPU backend: three peer nodes (OTP `peer'), two virtual devices each,
%% with this node, made distributed here, as the caller (it runs erlcuda too). The peers
%% are started with `connect_all' off so that they connect to this node only: a partition
%% of one of them stays a partition of one.
-module(erlcuda_cluster_tests).

-include_lib("eunit/include/eunit.hrl").

-define(ENV, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}]).
-define(CLUSTER_KEYS, [cluster_exclude, cluster_prefer]).

cluster_test_() ->
    {timeout, 900,
     {setup, fun start/0, fun stop/1,
      fun(Ctx) ->
              [{Name, {timeout, 60, fun() -> Test(Ctx) end}}
               || {Name, Test} <- [{"routing by node, and errors as replies", fun routing/1},
                                   {"1000 callers spread over the six devices", fun spread/1},
                                   {"exclude and prefer", fun exclude_prefer/1},
                                   {"a node whose figure is late is passed over",
                                    fun stale/1},
                                   {"a busy node's rate is measured and published",
                                    fun rate/1},
                                   {"buffers of other nodes, transfer", fun buffers/1},
                                   {"programs run on other nodes", fun programs/1},
                                   {"a kernel loaded only where the buffers live",
                                    fun kernel_where_the_buffers_live/1},
                                   {"launch_sync's timeout, no stray message", fun timeouts/1},
                                   {"await of a launch on another node", fun remote_await/1},
                                   {"a record stays while its proxy runs",
                                    fun slow_registration/1},
                                   {"a launch_sync that times out before its job came",
                                    fun cancel_early/1},
                                   {"proxies end with their jobs; bad messages to the agent",
                                    fun drain/1},
                                   {"the caller's erlcuda restarts: old jobs never meet new",
                                    fun caller_restarts/1},
                                   {"erlcuda restarts where the jobs run: no record stays",
                                    fun executing_restarts/1},
                                   {"a stopped node: launch_sync keeps its timeout",
                                    fun stopped_node/1},
                                   {"the agent restarts under load: no record stays",
                                    fun agent_restarts/1},
                                   {"killed proxies take their buffers with them",
                                    fun killed_proxies/1},
                                   {"keep jobs whose connection dropped keep nothing there",
                                    fun cut_keep_jobs/1},
                                   {"a connection that drops and comes back at once",
                                    fun flapping_connection/1},
                                   {"keep results handed over past a busy buffers server",
                                    fun busy_buffers_server/1},
                                   {"keep launches across a restart of erlcuda here",
                                    fun keep_across_restart_here/1},
                                   {"a hand-over across a restart of erlcuda here",
                                    fun handover_across_restart_here/1},
                                   {"{node, any} never runs a job twice over a dropped connection",
                                    fun flapping_any/1},
                                   {"traced remote jobs answer with stamps",
                                    fun traced_errors/1},
                                   {"a partition and a reconnect", fun partition/1},
                                   {"SIGKILL of a node under load", fun kill/1},
                                   {"a node that joins later takes work", fun join/1},
                                   {"the docs' cluster examples", fun doc_examples/1}]]
      end}}.

%% Set-up.

start() ->
    Distributed = distribute(),
    Saved = [{K, application:get_env(erlcuda, K)} || {K, _} <- ?ENV],
    _ = application:stop(erlcuda),
    _ = application:load(erlcuda),
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?ENV],
    [ok = application:unset_env(erlcuda, K) || K <- ?CLUSTER_KEYS],
    {ok, _} = application:ensure_all_started(erlcuda),
    Peers = parallel([fun start_peer/0 || _ <- lists:seq(1, 3)]),
    ok = wait_cluster([N || {_, N} <- Peers]),
    #{peers => Peers, distributed => Distributed, saved => Saved}.

stop(#{peers := Peers, distributed := Distributed, saved := Saved}) ->
    _ = [catch peer:stop(P) || {P, _} <- Peers],
    _ = application:stop(erlcuda),
    [ok = application:unset_env(erlcuda, K) || K <- ?CLUSTER_KEYS],
    [case V of
         {ok, Value} -> ok = application:set_env(erlcuda, K, Value);
         undefined -> ok = application:unset_env(erlcuda, K)
     end || {K, V} <- Saved],
    _ = [net_kernel:stop() || Distributed],
    ok.

%% This node, distributed (epmd started where it is not running): `true' if made so here.
distribute() ->
    case node() of
        nonode@nohost ->
            Epmd = case os:find_executable("epmd") of
                       false -> filename:join([code:root_dir(),
                                               "erts-" ++ erlang:system_info(version),
                                               "bin", "epmd"]);
                       Path -> Path
                   end,
            _ = os:cmd(Epmd ++ " -daemon"),
            {ok, _} = start_dist(list_to_atom("erlcuda_eunit_" ++ os:getpid() ++ "@127.0.0.1"),
                                 40),
            true;
        _ ->
            false
    end.

start_dist(Name, Tries) ->
    case net_kernel:start(Name, #{name_domain => longnames}) of
        {ok, _} = Ok -> Ok;
        %% epmd may take a moment to listen
        {error, _} when Tries > 0 -> timer:sleep(250), start_dist(Name, Tries - 1);
        Error -> Error
    end.

%% A peer node with erlcuda's code and this node's erlcuda env, erlcuda started, connected.
start_peer() ->
    [_, Host] = string:split(atom_to_list(node()), "@"),
    Ebin = filename:dirname(code:which(erlcuda)),
    {ok, Peer, Node} =
        peer:start(#{name => peer:random_name(erlcuda_peer), host => Host,
                     longnames => net_kernel:longnames(), connection => standard_io,
                     wait_boot => 60000,
                     args => ["-setcookie", atom_to_list(erlang:get_cookie()),
                              "-kernel", "connect_all", "false",
                              "-kernel", "prevent_overlapping_partitions", "false",
                              "-pa", Ebin]}),
    _ = peer:call(Peer, application, load, [erlcuda]),
    [ok = peer:call(Peer, application, set_env, [erlcuda, K, V])
     || {K, V} <- application:get_all_env(erlcuda)],
    {ok, _} = peer:call(Peer, application, ensure_all_started, [erlcuda], 60000),
    true = net_kernel:connect_node(Node),
    {Peer, Node}.

parallel(Funs) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {parallel, self(), F()} end) || F <- Funs],
    [receive {parallel, P, R} -> R end || P <- Pids].

%% Every node up in this node's view of the cluster, with its two devices.
wait_cluster(Nodes) ->
    erlcuda_test_util:wait_until(
      fun() ->
              Info = erlcuda:info(cluster),
              lists:all(fun(N) ->
                                case Info of
                                    #{N := #{status := up, devices := 2}} -> true;
                                    #{} -> false
                                end
                        end, Nodes)
      end, 300).

%% Jobs run on each device of a peer, as its worker counts them.
jobs(Peer) ->
    #{device_info := Devices} = peer:call(Peer, erlcuda, info, []),
    [maps:get(jobs, D) || D <- Devices].

local_jobs() ->
    #{device_info := Devices} = erlcuda:info(),
    lists:sum([maps:get(jobs, D) || D <- Devices]).

%% Keep a device of a node busy for Ms.
stall(Node, Device, Ms) ->
    erlcuda_test_util:stall(Node, Device, Ms).

receive_reply(Id) ->
    receive {erlcuda, Id, R} -> R after 10000 -> no_reply end.

%% A launch's record stays while its proxy runs there (a job waiting on a stalled device):
%% the node's connection drops, and the job's one reply is node_down.
slow_registration(#{peers := Peers}) ->
    {_, N} = lists:last(Peers),
    stall(N, 0, 2000),
    timer:sleep(100),
    {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{node, N}, {device, 0}]),
    ok = erlcuda_test_util:wait_until(
           fun() -> [P || {_, _, P, _, _, _} <- ets:lookup(erlcuda_remote, {N, Id}), is_pid(P)] =/= []
           end, 50),
    true = erlang:disconnect_node(N),
    receive
        {erlcuda, Id, Reply} -> ?assertEqual({error, {node_down, N}}, Reply)
    after 10000 -> error(no_reply)
    end,
    true = net_kernel:connect_node(N),
    ok = wait_cluster([N]),
    timer:sleep(2000),  % the stalled job ends there; its late result reaches nobody
    erlcuda_test_util:no_message(),
    records_gone().

%% Remote launch_sync calls with `{keep, true}' and a timeout of 0, to a node whose device
%% is stalled, some carrying a list of a million numbers (their proxies still check them
%% when the timeout comes): each answers timeout, none waits for the stalled device, no
%% stray message comes, and the buffers they were to keep are freed there.
cancel_early(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    Keep = [[1.0, 2.0]],
    Big = [[float(I) || I <- lists:seq(1, 1000000)]],
    stall(N1, 0, 3000),
    timer:sleep(100),
    Replies = [erlcuda:launch_sync(copy, Args, [{node, N1}, {device, 0}, {keep, true},
                                                {timeout, 0}])
               || Args <- lists:duplicate(3, Big) ++ lists:duplicate(20, Keep)],
    ?assertEqual([{error, timeout}], lists:usort(Replies)),
    %% every proxy ends, its job taken back
    ok = erlcuda_test_util:wait_until(fun() -> proxies(P1) =:= 0 end, 100),
    timer:sleep(300),
    erlcuda_test_util:no_message(),
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50),
    timer:sleep(3000),  % the stall ends
    %% A keep launch_sync whose reply comes as it times out: whichever wins, no buffer
    %% outlives the wait but those it answered with.
    Raced = [erlcuda:launch_sync(copy, Keep, [{node, N1}, {keep, true}, {timeout, T}])
             || T <- lists:seq(0, 3), _ <- lists:seq(1, 25)],
    ?assertEqual([], [R || R <- Raced, R =/= {error, timeout}, element(1, R) =/= ok]),
    [ok = erlcuda:free(B) || {ok, B} <- Raced],
    timer:sleep(300),
    erlcuda_test_util:no_message(),
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50),
    records_gone().

%% The proxies on a peer (erlcuda_remote:proxy/7) alive now.
proxies(Peer) ->
    length([P || P <- peer:call(Peer, erlang, processes, []),
                 peer:call(Peer, erlang, process_info, [P, initial_call])
                     =:= {initial_call, {erlcuda_remote, proxy, 7}}]).

%% Proxies end with their jobs and records go with them, for launches and launch_sync
%% alike; messages to the agent that are no proxy's are dropped without harm.
drain(#{peers := [{P1, N1} | _]}) ->
    [{ok, 1.0} = erlcuda:launch_sync(reduce, [[1.0]], [{node, N1}]) || _ <- lists:seq(1, 100)],
    Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{node, N1}]), Id end
           || _ <- lists:seq(1, 100)],
    ?assertEqual(#{{ok, 1.0} => 100}, count([receive_reply(Id) || Id <- Ids])),
    records_gone(),
    ok = erlcuda_test_util:wait_until(fun() -> proxies(P1) =:= 0 end, 50),
    Agent = whereis(erlcuda_cluster),
    Last = lists:last(Ids),
    [Agent ! M || M <- [{erlcuda_proxy, bad, self()}, {erlcuda_proxy, 1, self()},
                        {erlcuda_proxy, Last, self()},
                        {'DOWN', make_ref(), process, self(), normal}]],
    %% a proxy of no recorded job is told so too, and stops telling
    [receive {erlcuda_watched, I} -> ok after 5000 -> error({no_answer, I}) end
     || I <- [1, Last]],
    timer:sleep(100),
    erlcuda_test_util:no_message(),
    ?assertEqual(Agent, whereis(erlcuda_cluster)),
    ?assertEqual(0, ets:info(erlcuda_remote, size)).

records_gone() ->
    ok = erlcuda_test_util:wait_until(fun() -> ets:info(erlcuda_remote, size) =:= 0 end, 100).

%% The tests.

routing(#{peers := [{P1, N1} | _] = Peers}) ->
    Info = erlcuda:info(cluster),
    [?assertMatch(#{devices := 2, depths := [_, _], backend := cpu, status := up,
                    age_ms := _}, maps:get(N, Info))
     || N <- [node() | [N || {_, N} <- Peers]]],
    [J0, J1] = jobs(P1),
    ?assertEqual({ok, [4.0, 6.0]},
                 erlcuda:launch_sync(vector_add, [[1, 2], [3, 4]], [{node, N1}, {device, 0}])),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], #{node => N1,
                                                                         device => 1})),
    ?assertEqual([J0 + 1, J1 + 1], jobs(P1)),
    {ok, Id} = erlcuda:launch(dot_product, [[1.0, 2.0], [3.0, 4.0]], [{node, N1}]),
    ?assertEqual({ok, 11.0}, receive_reply(Id)),
    Bin = <<1.0:32/float-little, 2.0:32/float-little>>,
    {ok, Id2} = erlcuda:launch(vector_add, [Bin, Bin], [{node, N1}, {format, binary}]),
    ?assertEqual({ok, <<2.0:32/float-little, 4.0:32/float-little>>}, receive_reply(Id2)),
    ?assertEqual({ok, [2.0, 4.0]}, erlcuda:launch_sync(vector_add, [Bin, Bin], [{node, N1}])),
    ?assertEqual({ok, [1, 2]}, erlcuda:launch_sync(copy, [[1, 2]], [{node, N1}, {type, i32}])),
    ?assertMatch({ok, 3.0, #{<<"decode">> := _, <<"forward">> := _}},
                 erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{node, N1}, {trace, true}])),
    %% this node, by name
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{node, node()}])),
    %% refused at once: a node outside the cluster, a node option that names none
    ?assertEqual({error, {bad_node, 'nobody@127.0.0.1'}},
                 erlcuda:launch(reduce, [[1.0]], [{node, 'nobody@127.0.0.1'}])),
    ?assertEqual({error, {bad_node, 'nobody@127.0.0.1'}},
                 erlcuda:launch_sync(reduce, [[1.0]], [{node, 'nobody@127.0.0.1'}])),
    ?assertEqual({error, {bad_option, {node, 42}}},
                 erlcuda:launch_sync(reduce, [[1.0]], [{node, 42}])),
    %% what the executing node checks arrives as the job's one reply
    {ok, Id3} = erlcuda:launch(fft, [[1.0]], [{node, N1}]),
    ?assertEqual({error, {unknown_kernel, fft}}, receive_reply(Id3)),
    {ok, Id4} = erlcuda:launch(reduce, [[1.0]], [{node, N1}, {device, 7}]),
    ?assertEqual({error, {bad_device, 7}}, receive_reply(Id4)),
    ?assertMatch({error, {bad_args, _}},
                 erlcuda:launch_sync(vector_add, [[1.0], [1.0, 2.0]], [{node, N1}])),
    ?assertEqual({error, {bad_option, {format, csv}}},
                 erlcuda:launch_sync(reduce, [[1.0]], [{node, N1}, {format, csv}])),
    timer:sleep(100),
    erlcuda_test_util:no_message(),
    %% launch_sync's records go with their replies, launch's within two reconciliations
    records_gone().

%% 1000 callers, by node and by `any' (this node excluded), over the peers' six devices.
spread(#{peers := Peers}) ->
    Nodes = [N || {_, N} <- Peers],
    ok = application:set_env(erlcuda, cluster_exclude, [node()]),
    try
        Local = local_jobs(),
        Before = [jobs(P) || {P, _} <- Peers],
        ByNode = callers(1000, 2, fun(C, I) -> [{node, lists:nth(1 + (C + I) rem 3, Nodes)},
                                                {device, any}] end),
        ?assertEqual(lists:duplicate(2000, right), ByNode),
        Mid = [jobs(P) || {P, _} <- Peers],
        NodeShares = lists:append([[A - B || {A, B} <- lists:zip(M, Bf)]
                                   || {M, Bf} <- lists:zip(Mid, Before)]),
        ?debugFmt("by node: jobs per device ~w", [NodeShares]),
        ?assertEqual(2000, lists:sum(NodeShares)),
        %% every device takes a part (a fair share is a sixth: about 330)
        [?assert(S > 50) || S <- NodeShares],
        ByAny = callers(1000, 3, fun(_, _) -> [{node, any}] end),
        ?assertEqual(lists:duplicate(3000, right), ByAny),
        After = [jobs(P) || {P, _} <- Peers],
        AnyShares = lists:append([[A - B || {A, B} <- lists:zip(Af, M)]
                                  || {Af, M} <- lists:zip(After, Mid)]),
        ?debugFmt("by any: jobs per device ~w", [AnyShares]),
        ?assertEqual(3000, lists:sum(AnyShares)),
        [?assert(S > 75) || S <- AnyShares],
        %% an excluded node is never chosen by `any'
        ?assertEqual(Local, local_jobs()),
        records_gone()
    after
        application:unset_env(erlcuda, cluster_exclude)
    end.

%% N callers, each running Jobs launch_sync's with the options Opts(Caller, Job) gives;
%% every result checked.
callers(N, Jobs, Opts) ->
    lists:append(parallel([fun() -> [job(C, I, Opts(C, I)) || I <- lists:seq(1, Jobs)] end
                           || C <- lists:seq(1, N)])).

job(C, I, Opts) ->
    V = [float(C), float(I)],
    case erlcuda:launch_sync(vector_add, [V, V], [{timeout, 30000} | Opts]) of
        {ok, [X, Y]} when X == 2 * C, Y == 2 * I -> right;
        Other -> {wrong, Other}
    end.

exclude_prefer(#{peers := [{_, N1}, {P2, N2}, {_, N3}]}) ->
    try
        ok = application:set_env(erlcuda, cluster_prefer, [N2]),
        Before = lists:sum(jobs(P2)),
        [?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, any}]))
         || _ <- lists:seq(1, 50)],
        ?assertEqual(Before + 50, lists:sum(jobs(P2))),
        ok = application:set_env(erlcuda, cluster_exclude, [N3]),
        ok = erlcuda_test_util:wait_until(fun() -> not maps:is_key(N3, erlcuda:info(cluster))
                                          end, 50),
        ?assertEqual({error, {bad_node, N3}},
                     erlcuda:launch_sync(reduce, [[1.0]], [{node, N3}])),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N1}])),
        ok = application:unset_env(erlcuda, cluster_exclude),
        ok = wait_cluster([N3]),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N3}]))
    after
        [application:unset_env(erlcuda, K) || K <- ?CLUSTER_KEYS]
    end.

%% `{node, any}' trusts a node's figure only while it is fresh. Here the preferred node's
%% agent stops publishing: once its figure is over a second old, no job goes there; when
%% figures come again, jobs do.
stale(#{peers := [_, {P2, N2} | _]}) ->
    Any = fun() -> [{ok, 1.0} = erlcuda:launch_sync(reduce, [[1.0]], [{node, any}])
                    || _ <- lists:seq(1, 30)]
          end,
    try
        ok = application:set_env(erlcuda, cluster_prefer, [N2]),
        Fresh = fun() -> maps:get(age_ms, maps:get(N2, erlcuda:info(cluster))) < 500 end,
        ok = erlcuda_test_util:wait_until(Fresh, 50),
        Before = lists:sum(jobs(P2)),
        Any(),
        ?assertEqual(Before + 30, lists:sum(jobs(P2))),
        ok = peer:call(P2, sys, suspend, [erlcuda_cluster]),
        timer:sleep(1300),
        Any(),
        ?assertEqual(Before + 30, lists:sum(jobs(P2))),
        ok = peer:call(P2, sys, resume, [erlcuda_cluster]),
        ok = erlcuda_test_util:wait_until(Fresh, 50),
        Any(),
        ?assertEqual(Before + 60, lists:sum(jobs(P2)))
    after
        _ = (catch peer:call(P2, sys, resume, [erlcuda_cluster])),
        [application:unset_env(erlcuda, K) || K <- ?CLUSTER_KEYS]
    end.

%% A node measures the jobs it answers a second over ticks where it has some in flight,
%% and publishes it with its figure: `{node, any}' weighs queues by it. The load runs a
%% second at least and until the figure here carries the rate (on a slow machine its first
%% ticks may come late), and the rate is compared with the callers' own.
rate(#{peers := [{_, N1} | _]}) ->
    RateOf = fun() -> maps:get(rate, maps:get(N1, erlcuda:info(cluster))) end,
    Stop = atomics:new(1, []),
    Loop = fun Loop(N) ->
                   case atomics:get(Stop, 1) of
                       0 -> {ok, 1.0} = erlcuda:launch_sync(reduce, [[1.0]], [{node, N1}]),
                            Loop(N + 1);
                       _ -> N
                   end
           end,
    Self = self(),
    T0 = erlang:monotonic_time(millisecond),
    Pids = [spawn_link(fun() -> Self ! {looped, self(), Loop(0)} end) || _ <- lists:seq(1, 50)],
    timer:sleep(1000),
    Published = erlcuda_test_util:wait_until(fun() -> RateOf() > 0 end, 190),
    Rate = RateOf(),
    atomics:put(Stop, 1, 1),
    Jobs = lists:sum([receive {looped, P, N} -> N after 30000 -> error(caller_hung) end
                      || P <- Pids]),
    PerSecond = Jobs * 1000 / (erlang:monotonic_time(millisecond) - T0),
    ?debugFmt("~.1f jobs/s from the callers; the node's rate: ~.1f jobs/s", [PerSecond, Rate]),
    ?assertEqual(ok, Published),
    ?assert(Rate > PerSecond / 4 andalso Rate < PerSecond * 4),
    %% Idle a second, the rate is forgotten; busy on a stalled device, it is measured
    %% slow, not 0.0 ("not measured"), which would draw callers to it.
    ok = erlcuda_test_util:wait_until(fun() -> RateOf() == 0 end, 30),
    stall(N1, 0, 1500),
    timer:sleep(100),
    {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{node, N1}, {device, 0}]),
    ok = erlcuda_test_util:wait_until(fun() -> RateOf() > 0 end, 30),
    ?assert(RateOf() < 1),
    ?assertEqual({ok, 1.0}, receive_reply(Id)).

%% A program's run is a launch: it goes to the node named, or to the node of its buffers
%% (the caller's inputs, or those its steps name), and its kept outputs are the caller's.
programs(#{peers := [{P1, N1}, {_, N2} | _]}) ->
    Self = self(),
    {ok, P} = erlcuda:program(#{inputs => [a, b], steps => [{s, vector_add, [a, b]},
                                                            {t, reduce, [s]}],
                                outputs => [t, s]}),
    [J0, J1] = jobs(P1),
    ?assertEqual({ok, [10.0, [4.0, 6.0]]},
                 erlcuda:run_sync(P, [[1.0, 2.0], [3.0, 4.0]], [{node, N1}, {device, 1}])),
    ?assertEqual([J0, J1 + 1], jobs(P1)),
    ?assertMatch({ok, [10.0, _]}, erlcuda:run_sync(P, [[1.0, 2.0], [3.0, 4.0]], [{node, any}])),
    {ok, Id} = erlcuda:run(P, [[1.0], [2.0]], [{node, N2}]),
    ?assertEqual({ok, [3.0, [3.0]]}, receive_reply(Id)),
    {ok, Id2} = erlcuda:run(P, [[1.0], [2.0, 3.0]], [{node, N2}]),
    ?assertMatch({error, {step, 1, {bad_args, _}}}, receive_reply(Id2)),
    %% a buffer of N1, as an input or named in a step: the run goes there
    {ok, B} = erlcuda:upload([1.0, 2.0], [{node, N1}]),
    ?assertEqual({ok, [6.0, [2.0, 4.0]]}, erlcuda:run_sync(P, [B, B])),
    {ok, Baked} = erlcuda:program(#{inputs => [a], steps => [{s, vector_add, [a, B]}],
                                    outputs => s}),
    ?assertEqual({ok, [11.0, 22.0]}, erlcuda:run_sync(Baked, [[10.0, 20.0]])),
    {ok, [_, K]} = erlcuda:run_sync(P, [B, [1.0, 1.0]], [{keep, true}]),
    ?assertMatch({erlcuda_buffer, N1, _, 0, _, f32, 2}, K),
    ?assertMatch(#{owner := Self}, erlcuda:buffer_info(K)),
    ?assertEqual({ok, [2.0, 3.0]}, erlcuda:download(K)),
    ok = erlcuda:free(K),
    ok = erlcuda:free(B),
    timer:sleep(100),
    erlcuda_test_util:no_message().

buffers(#{peers := [{P1, N1}, {P2, N2} | _]}) ->
    Self = self(),
    Base1 = peer:call(P1, erlcuda_buffers, count, []),
    Base2 = peer:call(P2, erlcuda_buffers, count, []),
    {ok, B} = erlcuda:upload([1.0, 2.0, 3.0], [{node, N1}, {type, f64}]),
    ?assertMatch({erlcuda_buffer, N1, _, 0, _, f64, 3}, B),
    ?assertMatch(#{node := N1, owner := Self, elements := 3, bytes := 24},
                 erlcuda:buffer_info(B)),
    %% a launch with it runs where it lives, by default or by `any'
    ?assertEqual({ok, 6.0}, erlcuda:launch_sync(reduce, [B])),
    ?assertEqual({ok, 6.0}, erlcuda:launch_sync(reduce, [B], [{node, any}])),
    {ok, Id} = erlcuda:launch(vector_add, [B, B]),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, receive_reply(Id)),
    %% anywhere else it is an error at once
    ?assertEqual({error, {remote_buffer, B}}, erlcuda:launch_sync(reduce, [B], [{node, N2}])),
    ?assertEqual({error, {remote_buffer, B}}, erlcuda:launch(reduce, [B], [{node, node()}])),
    {ok, Z} = erlcuda:zeros(f64, 3, [{node, N2}]),
    ?assertEqual({error, {remote_buffer, Z}}, erlcuda:launch_sync(vector_add, [B, Z])),
    %% kept results stay there, owned by this process
    {ok, C} = erlcuda:launch_sync(vector_add, [B, B], [{keep, true}]),
    ?assertMatch({erlcuda_buffer, N1, _, 0, _, f64, 3}, C),
    ?assertMatch(#{owner := Self}, erlcuda:buffer_info(C)),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, erlcuda:download(C)),
    %% transfer: to another node, to this one, to a device of the same node
    {ok, T} = erlcuda:transfer(C, N2),
    ?assertMatch({erlcuda_buffer, N2, _, 0, _, f64, 3}, T),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, erlcuda:download(T)),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, erlcuda:launch_sync(vector_add, [T, Z], [])),
    {ok, L} = erlcuda:transfer(C, node()),
    ?assertEqual(node(), element(2, L)),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, erlcuda:download(L)),
    {ok, L1} = erlcuda:transfer(L, N1, [{device, 1}]),
    ?assertMatch({erlcuda_buffer, N1, _, 1, _, f64, 3}, L1),
    {ok, Copy} = erlcuda:transfer(C, N1),
    ?assertEqual({ok, [2.0, 4.0, 6.0]}, erlcuda:download(Copy)),
    ?assertEqual({error, {bad_node, 'nobody@127.0.0.1'}},
                 erlcuda:transfer(C, 'nobody@127.0.0.1')),
    ?assertMatch({error, {bad_args, _}}, erlcuda:transfer(not_a_buffer, N1)),
    %% only the owner frees or gives; give hands it over
    Other = spawn(fun() ->
                          receive {free, Buf} -> Self ! {freed, erlcuda:free(Buf)} end
                  end),
    spawn(fun() -> Self ! {other_free, erlcuda:free(C), erlcuda:give(C, self())} end),
    receive {other_free, R1, R2} -> ?assertEqual({not_owner, not_owner},
                                                 {element(2, R1), element(2, R2)})
    after 5000 -> error(no_answer) end,
    ?assertEqual(ok, erlcuda:free(B)),
    ?assertEqual(ok, erlcuda:free(B)),
    ?assertEqual({error, {buffer_lost, B}}, erlcuda:launch_sync(reduce, [B])),
    ?assertEqual(ok, erlcuda:give(C, Other)),
    ?assertMatch(#{owner := Other}, erlcuda:buffer_info(C)),
    ?assertEqual({error, not_owner}, erlcuda:free(C)),
    Other ! {free, C},
    receive {freed, F} -> ?assertEqual(ok, F) after 5000 -> error(no_free) end,
    [ok = erlcuda:free(X) || X <- [T, Z, L, L1, Copy]],
    %% an owner's exit frees what it held on other nodes
    {Pid, Ref} = spawn_monitor(fun() ->
                                       {ok, _} = erlcuda:upload([1.0], [{node, N2}]),
                                       {ok, _} = erlcuda:launch_sync(copy, [[1.0]],
                                                                     [{node, N1},
                                                                      {keep, true}])
                               end),
    receive {'DOWN', Ref, process, Pid, normal} -> ok end,
    ok = erlcuda_test_util:wait_until(fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base1
                                      end, 50),
    ok = erlcuda_test_util:wait_until(fun() -> peer:call(P2, erlcuda_buffers, count, []) =:= Base2
                                      end, 50),
    erlcuda_test_util:no_message().

timeouts(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    stall(N1, 0, 1500),
    timer:sleep(100),
    ?assertEqual({error, timeout}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N1},
                                                                         {device, 0},
                                                                         {timeout, 200}])),
    %% a job that was to keep its result is taken back there
    ?assertEqual({error, timeout}, erlcuda:launch_sync(copy, [[1.0, 2.0]],
                                                       [{node, N1}, {device, 0}, {keep, true},
                                                        {timeout, 100}])),
    {ok, Id} = erlcuda:launch(reduce, [[2.0]], [{node, N1}, {device, 0}]),
    ?assertEqual({ok, 2.0}, receive_reply(Id)),
    %% the late results never arrive
    timer:sleep(300),
    erlcuda_test_util:no_message(),
    ?assertEqual(Base, peer:call(P1, erlcuda_buffers, count, [])),
    ?assertEqual({error, timeout}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N1},
                                                                         {timeout, 0}])),
    timer:sleep(200),
    erlcuda_test_util:no_message(),
    records_gone().

%% erlcuda:await/2 of a launch that runs on another node: its reply; when the time runs out
%% on a stalled device there, the job is dropped there (with the buffers it was to keep)
%% and its record here goes, and no reply comes after the timeout.
remote_await(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    {ok, Id} = erlcuda:launch(reduce, [[1.0, 2.0]], [{node, N1}]),
    ?assertEqual({ok, 3.0}, erlcuda:await(Id, 10000)),
    stall(N1, 0, 1500),
    timer:sleep(100),
    {ok, Late} = erlcuda:launch(reduce, [[1.0]], [{node, N1}, {device, 0}]),
    {ok, Kept} = erlcuda:launch(copy, [[1.0, 2.0]], [{node, N1}, {device, 0}, {keep, true}]),
    ?assertEqual({error, timeout}, erlcuda:await(Late, 100)),
    ?assertEqual({error, timeout}, erlcuda:await(Kept, 0)),
    %% after the stall, a job behind them on that device is answered after they would be
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{node, N1}, {device, 0},
                                                                  {timeout, 10000}])),
    records_gone(),
    erlcuda_test_util:no_message(),
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50).

partition(#{peers := [_, {P2, N2} | _]}) ->
    Base = peer:call(P2, erlcuda_buffers, count, []),
    {ok, Held} = erlcuda:upload([1.0], [{node, N2}, {device, 1}]),
    ?assertEqual(Base + 1, peer:call(P2, erlcuda_buffers, count, [])),
    stall(N2, 0, 2000),
    timer:sleep(100),
    Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{node, N2}, {device, 0}]), Id end
           || _ <- lists:seq(1, 20)],
    timer:sleep(200),
    true = erlang:disconnect_node(N2),
    %% every job there answers node_down, once
    ?assertEqual(#{{error, {node_down, N2}} => 20}, count([receive_reply(Id) || Id <- Ids])),
    %% and it leaves this node's view (its agent hears of the loss in its own time)
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> not maps:is_key(N2, erlcuda:info(cluster)) end, 50)),
    %% a buffer owned across the lost connection is freed there
    ok = erlcuda_test_util:wait_until(fun() -> peer:call(P2, erlcuda_buffers, count, []) =:= Base
                                      end, 50),
    %% its results, sent once the stall ends, never arrive (they reconnect the node to go)
    timer:sleep(2500),
    erlcuda_test_util:no_message(),
    %% back in the cluster, it takes work again
    true = net_kernel:connect_node(N2),
    ok = wait_cluster([N2]),
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N2}])),
    ?assertEqual({error, {buffer_lost, Held}}, erlcuda:launch_sync(reduce, [Held])),
    records_gone().

%% erlcuda restarts on this node, the caller's, while the executing nodes still run or
%% have just answered its earlier jobs. The jobs of the new start are of other ids: each
%% launch_sync is answered, and the records of new async jobs stay until they are
%% answered, here by a partition.
caller_restarts(#{peers := [{_, N1}, {_, N2} | _]}) ->
    Sync = fun() -> [erlcuda:launch_sync(reduce, [[1.0]], [{node, N1}, {timeout, 3000}])
                     || _ <- lists:seq(1, 300)] end,
    Async = fun() -> [begin {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{node, N2},
                                                                       {device, 0}]), Id end
                      || _ <- lists:seq(1, 50)] end,
    restart_here([N1, N2]),
    ?assertEqual(#{{ok, 1.0} => 300}, count(Sync())),
    stall(N2, 0, 1500),
    timer:sleep(100),
    Old = Async(),
    restart_here([N1, N2]),
    ?assertEqual(#{{ok, 1.0} => 300}, count(Sync())),
    %% The old jobs finish and are reported while the new ones wait on a stalled device.
    ?assertEqual(#{{ok, 1.0} => 50}, count([receive_reply(Id) || Id <- Old])),
    stall(N2, 0, 8000),
    timer:sleep(100),
    New = Async(),
    ?assertEqual([], [Id || Id <- New, lists:member(Id, Old)]),
    timer:sleep(4500),
    true = erlang:disconnect_node(N2),
    ?assertEqual(#{{error, {node_down, N2}} => 50}, count([receive_reply(Id) || Id <- New])),
    true = net_kernel:connect_node(N2),
    ok = wait_cluster([N1, N2]),
    erlcuda_test_util:no_message(),
    records_gone().

%% erlcuda restarts on the executing node with this node's launches in flight there: each
%% is answered once (worker_down, by its proxy), and no record of them stays here.
executing_restarts(#{peers := [_, {P2, N2} | _]}) ->
    stall(N2, 0, 3000),
    timer:sleep(100),
    Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{node, N2}, {device, 0}]), Id end
           || _ <- lists:seq(1, 200)],
    timer:sleep(200),
    ok = peer:call(P2, application, stop, [erlcuda]),
    {ok, _} = peer:call(P2, application, ensure_all_started, [erlcuda], 60000),
    Replies = [receive_reply(Id) || Id <- Ids],
    ?assertEqual([], [R || R <- Replies, not is_worker_down(R)]),
    records_gone(),
    ok = wait_cluster([N2]),
    timer:sleep(200),
    erlcuda_test_util:no_message(),
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N2}])).

is_worker_down({error, {worker_down, _}}) -> true;
is_worker_down(_) -> false.

%% A node that stops answering (SIGSTOP: its connection stays up until the tick time):
%% a remote launch_sync answers timeout while it is still stopped, before its proxy even
%% started and after, with {keep, true} too (that one waits for its proxy a few seconds).
stopped_node(#{peers := [{P1, N1} | _]}) ->
    OsPid = peer:call(P1, os, getpid, []),
    Base = peer:call(P1, erlcuda_buffers, count, []),
    Self = self(),
    %% Each caller lives on after its answer: a buffer handed to it would stay its own.
    Call = fun(Opts) -> spawn_link(fun() ->
                                           Self ! {stopped, Opts,
                                                   erlcuda:launch_sync(copy, [[1.0]],
                                                                       [{node, N1} | Opts])},
                                           receive done -> ok end
                                   end)
           end,
    stall(N1, 0, 1500),
    timer:sleep(100),
    Early = [Call([{timeout, 300}]), Call([{timeout, 300}, {keep, true}])],
    timer:sleep(50),
    "" = os:cmd("kill -STOP " ++ OsPid),
    Callers = try
                  Late = [Call([{timeout, 200}]), Call([{timeout, 200}, {keep, true}])],
                  Got = [receive {stopped, _, R} -> R after 15000 -> still_waiting end
                         || _ <- lists:seq(1, 4)],
                  ?assertEqual([{error, timeout}], lists:usort(Got)),
                  Early ++ Late
              after
                  os:cmd("kill -CONT " ++ OsPid)
              end,
    ok = wait_cluster([N1]),
    %% The proxies of the calls that gave up, started or not when the node stopped, run
    %% nothing for them: no buffer there is theirs.
    ok = erlcuda_test_util:wait_until(fun() -> proxies(P1) =:= 0 end, 100),
    timer:sleep(1000),
    ?assertEqual(Base, peer:call(P1, erlcuda_buffers, count, [])),
    [C ! done || C <- Callers],
    erlcuda_test_util:no_message(),
    records_gone().

%% The agent, which watches the proxies of this node's launches, is killed again and again
%% while launches run on another node: every job is answered once, and no record stays
%% (a proxy that told a dead agent it runs tells the next one).
agent_restarts(#{peers := [{_, N1} | _]}) ->
    Self = self(),
    Callers = [spawn_link(fun() -> Self ! {caller, self(), async_loop(N1, 150)} end)
               || _ <- lists:seq(1, 4)],
    _ = [begin timer:sleep(150), exit(whereis(erlcuda_cluster), kill) end
         || _ <- lists:seq(1, 3)],
    Results = lists:append([receive {caller, C, R} -> R after 60000 -> [lost] end
                            || C <- Callers]),
    ?assertEqual(#{{ok, 1.0} => 600}, count(Results)),
    ok = wait_cluster([N1]),
    records_gone().

%% 150 launches, at most 10 in flight, each answered: their replies.
async_loop(Node, Jobs) ->
    async_loop(Node, Jobs, [], []).

async_loop(_, 0, [], Acc) ->
    Acc;
async_loop(Node, Left, InFlight, Acc) when Left > 0, length(InFlight) < 10 ->
    case erlcuda:launch(reduce, [[1.0]], [{node, Node}]) of
        {ok, Id} -> async_loop(Node, Left - 1, [Id | InFlight], Acc);
        {error, _} = E -> async_loop(Node, Left - 1, InFlight, [E | Acc])
    end;
async_loop(Node, Left, InFlight, Acc) ->
    receive
        {erlcuda, Id, R} when is_integer(Id) ->
            async_loop(Node, Left, lists:delete(Id, InFlight), [R | Acc])
    after 20000 ->
        Acc ++ [lost || _ <- InFlight]
    end.

%% Proxies of launches that keep buffers, killed there while their jobs wait on a stalled
%% device: each job is answered once (an error), and the buffers they were to keep go.
killed_proxies(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    stall(N1, 0, 3000),
    timer:sleep(100),
    Ids = [begin {ok, Id} = erlcuda:launch(copy, [[1.0]], [{node, N1}, {device, 0},
                                                          {keep, true}]), Id end
           || _ <- lists:seq(1, 10)],
    ok = erlcuda_test_util:wait_until(fun() -> proxies(P1) =:= 10 end, 50),
    _ = [peer:call(P1, erlang, exit, [P, kill])
         || P <- peer:call(P1, erlang, processes, []),
            peer:call(P1, erlang, process_info, [P, initial_call])
                =:= {initial_call, {erlcuda_remote, proxy, 7}}],
    Replies = [receive_reply(Id) || Id <- Ids],
    ?assertEqual([], [R || R <- Replies, element(1, R) =/= error]),
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50),
    records_gone().

%% Keep jobs, launch and launch_sync, wait on a stalled device there when this node's
%% connection to that node drops: each is answered node_down at once, and when the
%% connection is back (the callers alive) their proxies have ended and freed what the
%% jobs were to keep, none handed to a caller that was told node_down.
cut_keep_jobs(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    stall(N1, 0, 1500),
    timer:sleep(100),
    Keep = [{node, N1}, {device, 0}, {keep, true}],
    Ids = [begin {ok, Id} = erlcuda:launch(copy, [[1.0]], Keep), Id end
           || _ <- lists:seq(1, 6)],
    Self = self(),
    Syncs = [spawn_link(fun() ->
                                Self ! {sync, self(), erlcuda:launch_sync(
                                                        copy, [[2.0]],
                                                        [{timeout, infinity} | Keep])},
                                receive done -> ok end
                        end) || _ <- lists:seq(1, 3)],
    ok = erlcuda_test_util:wait_until(fun() -> proxies(P1) =:= 9 end, 50),
    true = erlang:disconnect_node(N1),
    Down = {error, {node_down, N1}},
    ?assertEqual(lists:duplicate(6, Down), [receive_reply(Id) || Id <- Ids]),
    ?assertEqual(lists:duplicate(3, Down),
                 [receive {sync, S, R} -> R after 10000 -> no_reply end || S <- Syncs]),
    true = net_kernel:connect_node(N1),
    ok = wait_cluster([N1]),
    %% the stall ends there; a result nobody takes is freed within the hand-over's 5 s
    ok = erlcuda_test_util:wait_until(fun() -> proxies(P1) =:= 0 end, 150),
    ?assertEqual(Base, peer:call(P1, erlcuda_buffers, count, [])),
    [S ! done || S <- Syncs],
    erlcuda_test_util:no_message(),
    records_gone().

%% Keep jobs, launch and launch_sync, while this node's connection to theirs drops and is
%% made again at once, at a moment that differs each round (before, during or after the
%% hand-over of their results): each job is answered once, its buffer or node_down, and
%% once the callers freed what they got nothing of theirs stays there.
flapping_connection(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    Self = self(),
    Caller = spawn_link(fun() -> flapping_caller(Self, N1) end),
    Answers = lists:append([flap(Caller, N1, Round) || Round <- lists:seq(1, 20)]),
    %% (a launch made as the connection drops may find the node gone: bad_node)
    ?assertEqual([], [A || A <- Answers, A =/= ok, A =/= {error, {node_down, N1}},
                           A =/= {error, {bad_node, N1}}]),
    ?assertEqual(80, length(Answers)),
    ok = wait_cluster([N1]),
    %% a result nobody took is freed within the hand-over's 5 s
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 100),
    Caller ! {done, self()},
    receive {flapped, Caller, Stray} -> ?assertEqual([], Stray) after 5000 -> error(no_caller) end,
    records_gone().

flap(Caller, Node, Round) ->
    _ = net_kernel:connect_node(Node),
    ok = erlcuda_test_util:wait_until(fun() -> erlcuda_cluster:is_member(Node) end, 100),
    Caller ! {go, self()},
    Until = erlang:monotonic_time(microsecond) + (Round * 317) rem 6000,
    spin(Until),
    _ = erlang:disconnect_node(Node),
    _ = net_kernel:connect_node(Node),
    receive {answers, Caller, Answers} -> Answers after 30000 -> [lost] end.

spin(Until) ->
    case erlang:monotonic_time(microsecond) >= Until of
        true -> ok;
        false -> spin(Until)
    end.

%% A launch with buffers of another node runs there, without `{node, _}': a kernel loaded
%% there and not here too, judged where it runs (an unknown kernel anywhere is still one).
kernel_where_the_buffers_live(#{peers := [{P1, N1} | _]}) ->
    ok = peer:call(P1, erlcuda, elementwise,
                   [twice_there, [{x, f32}], [{y, f32}], <<"y = 2 * x">>], 60000),
    {ok, B} = erlcuda:upload([1.0, 2.0], [{node, N1}]),
    try
        ?assertEqual({error, {unknown_kernel, twice_there}},
                     erlcuda:launch_sync(twice_there, [[1.0, 2.0]])),
        ?assertEqual({ok, [2.0, 4.0]}, erlcuda:launch_sync(twice_there, [B])),
        {ok, Id} = erlcuda:launch(twice_there, [B]),
        ?assertEqual({ok, [2.0, 4.0]}, receive_reply(Id)),
        ?assertEqual({error, {unknown_kernel, nowhere}}, erlcuda:launch_sync(nowhere, [B])),
        %% buffers of two nodes run nowhere: the kernel is judged here
        {ok, L} = erlcuda:upload([1.0, 2.0]),
        ?assertEqual({error, {unknown_kernel, twice_there}},
                     erlcuda:launch_sync(twice_there, [L, B])),
        ?assertEqual({error, {unknown_kernel, twice_there}},
                     erlcuda:launch(twice_there, [B, L])),
        ok = erlcuda:free(L)
    after
        ok = erlcuda:free(B),
        _ = peer:call(P1, erlcuda, unload, [twice_there])
    end.

%% The executing node's buffers server is held up for 7 s as two keep jobs hand their
%% results over (a launch_sync with a 20 s timeout, a launch): both still get their
%% buffers, and once freed nothing stays there.
busy_buffers_server(#{peers := [{P1, N1} | _]}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    Keep = [{node, N1}, {device, 0}, {keep, true}],
    stall(N1, 0, 600),
    timer:sleep(100),
    Self = self(),
    Sync = spawn_link(fun() ->
                              Self ! {sync, self(), erlcuda:launch_sync(copy, [[1.0]],
                                                                        [{timeout, 20000}
                                                                         | Keep])}
                      end),
    {ok, Id} = erlcuda:launch(copy, [[2.0]], Keep),
    timer:sleep(200),
    ok = peer:call(P1, sys, suspend, [erlcuda_buffers]),
    try
        timer:sleep(7000)
    after
        ok = peer:call(P1, sys, resume, [erlcuda_buffers])
    end,
    SyncReply = receive {sync, Sync, R} -> R after 20000 -> no_reply end,
    ?assertMatch({ok, {erlcuda_buffer, N1, _, _, _, f32, 1}}, SyncReply),
    AsyncReply = receive_reply(Id),
    ?assertMatch({ok, {erlcuda_buffer, N1, _, _, _, f32, 1}}, AsyncReply),
    [ok = erlcuda:free(B) || {ok, B} <- [SyncReply, AsyncReply]],
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50),
    erlcuda_test_util:no_message(),
    records_gone().

%% Keep launches wait on a stalled device there while erlcuda restarts on this node, whose
%% records of them go with it: each still gets its one reply, its buffer, from its proxy.
keep_across_restart_here(#{peers := [{P1, N1} | _] = Peers}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    stall(N1, 0, 5000),
    timer:sleep(100),
    Ids = [begin {ok, Id} = erlcuda:launch(copy, [[1.0]], [{node, N1}, {device, 0},
                                                          {keep, true}]), Id end
           || _ <- lists:seq(1, 5)],
    restart_here([N || {_, N} <- Peers]),
    %% the jobs are still waiting there
    ?assertEqual(5, proxies(P1)),
    Replies = [receive_reply(Id) || Id <- Ids],
    ?assertEqual([], [R || R <- Replies, not is_tuple(R) orelse element(1, R) =/= ok]),
    [ok = erlcuda:free(B) || {ok, B} <- Replies],
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50),
    timer:sleep(300),
    erlcuda_test_util:no_message(),
    records_gone().

%% erlcuda restarts on this node while a keep launch's result is in the middle of its
%% hand-over (held in the record here, its proxy held up by the buffers server there):
%% the record goes, and the launch still gets its one reply, its buffer.
handover_across_restart_here(#{peers := [{P1, N1} | _] = Peers}) ->
    Base = peer:call(P1, erlcuda_buffers, count, []),
    stall(N1, 0, 3000),
    timer:sleep(100),
    {ok, Id} = erlcuda:launch(copy, [[1.0]], [{node, N1}, {device, 0}, {keep, true}]),
    timer:sleep(200),
    ok = peer:call(P1, sys, suspend, [erlcuda_buffers]),
    try
        ok = erlcuda_test_util:wait_until(
               fun() -> [H || {_, _, _, _, H, _} <- ets:tab2list(erlcuda_remote), H =/= none]
                            =/= []
               end, 150),
        restart_here([N || {_, N} <- Peers])
    after
        ok = peer:call(P1, sys, resume, [erlcuda_buffers])
    end,
    Reply = receive_reply(Id),
    ?assertMatch({ok, {erlcuda_buffer, N1, _, _, _, f32, 1}}, Reply),
    ok = erlcuda:free(element(2, Reply)),
    ok = erlcuda_test_util:wait_until(
           fun() -> peer:call(P1, erlcuda_buffers, count, []) =:= Base end, 50),
    timer:sleep(300),
    erlcuda_test_util:no_message(),
    records_gone().

%% `{node, any}' launch_sync calls, the node they go to preferred, while its connection
%% drops and comes back at each one: a call that lost its node is answered node_down (its
%% job may have run there), and is never sent to another node as well.
flapping_any(#{peers := [{_, N1} | _] = Peers}) ->
    ok = application:set_env(erlcuda, cluster_exclude, [node()]),
    ok = application:set_env(erlcuda, cluster_prefer, [N1]),
    try
        Before = lists:sum([lists:sum(jobs(P)) || {P, _} <- Peers]),
        Self = self(),
        Answers = [begin
                       _ = net_kernel:connect_node(N1),
                       ok = wait_cluster([N1]),
                       C = spawn_link(fun() ->
                                              Self ! {any, self(), erlcuda:launch_sync(
                                                                    reduce, [[1.0]],
                                                                    [{node, any},
                                                                     {timeout, 20000}])}
                                      end),
                       spin(erlang:monotonic_time(microsecond) + (Round * 211) rem 3000),
                       _ = erlang:disconnect_node(N1),
                       _ = net_kernel:connect_node(N1),
                       receive {any, C, R} -> R after 30000 -> no_reply end
                   end || Round <- lists:seq(1, 40)],
        ?assertEqual([], [A || A <- Answers, A =/= {ok, 1.0}, A =/= {error, {node_down, N1}}]),
        ok = wait_cluster([N1]),
        timer:sleep(500),
        Ran = lists:sum([lists:sum(jobs(P)) || {P, _} <- Peers]) - Before,
        ?debugFmt("{node, any} over a flapping connection: ~p; ~b jobs ran for 40 calls",
                  [count(Answers), Ran]),
        ?assert(Ran =< 40)
    after
        [application:unset_env(erlcuda, K) || K <- ?CLUSTER_KEYS]
    end.

%% Three launches and a launch_sync that keep their results, for each `go'; every buffer
%% it gets is freed at once, and it lives on, so that one handed to it stays its own.
flapping_caller(Test, Node) ->
    receive
        {go, Test} ->
            Keep = [{node, Node}, {keep, true}],
            Launched = [erlcuda:launch(copy, [[1.0]], Keep) || _ <- lists:seq(1, 3)],
            Async = [case L of
                         {ok, Id} -> receive {erlcuda, Id, R} -> R after 20000 -> no_reply end;
                         Refused -> Refused
                     end || L <- Launched],
            Sync = erlcuda:launch_sync(copy, [[1.0]], [{timeout, 20000} | Keep]),
            Answers = [case R of
                           {ok, B} ->
                               %% freed once its node is back in the cluster
                               ok = erlcuda_test_util:wait_until(
                                      fun() -> erlcuda_cluster:is_member(Node) end, 100),
                               ok = erlcuda:free(B);
                           Other ->
                               Other
                       end || R <- [Sync | Async]],
            Test ! {answers, self(), Answers},
            flapping_caller(Test, Node);
        {done, Test} ->
            Test ! {flapped, self(), receive_all([])}
    end.

receive_all(Acc) ->
    receive M -> receive_all([M | Acc]) after 200 -> Acc end.

%% With {trace, true} a remote job's error keeps the traced shape, whoever answers it: the
%% other node's check, or this node for a node gone.
traced_errors(#{peers := [{_, N1} | _]}) ->
    ?assertMatch({error, {bad_args, _}, #{}},
                 erlcuda:launch_sync(vector_add, [[1.0], [1.0, 2.0]], [{node, N1},
                                                                     {trace, true}])),
    {ok, Id} = erlcuda:launch(vector_add, [[1.0], [1.0, 2.0]], [{node, N1}, {trace, true}]),
    ?assertMatch({error, {bad_args, _}, #{}},
                 receive {erlcuda, Id, R, Stamps} -> {element(1, R), element(2, R), Stamps}
                 after 10000 -> no_reply
                 end),
    records_gone().

restart_here(Peers) ->
    ok = application:stop(erlcuda),
    {ok, _} = application:ensure_all_started(erlcuda),
    ok = wait_cluster(Peers).

%% 300 callers keep jobs in flight over the cluster (`any', this node excluded); one peer's
%% BEAM is killed part-way: every job gets one reply, its right result or node_down.
kill(#{peers := [{P1, N1}, {P2, N2}, {P3, N3}]}) ->
    ok = application:set_env(erlcuda, cluster_exclude, [node()]),
    try
        OsPid = peer:call(P3, os, getpid, []),
        {ok, B3} = erlcuda:upload([1.0], [{node, N3}]),
        Self = self(),
        _ = spawn(fun() ->
                          timer:sleep(300),
                          _ = os:cmd("kill -9 " ++ OsPid),
                          Self ! {killed, erlang:monotonic_time(millisecond)}
                  end),
        Results = lists:append(parallel([fun() -> async_caller(C, 40) end
                                         || C <- lists:seq(1, 300)])),
        End = erlang:monotonic_time(millisecond),
        Killed = receive {killed, At} -> At after 30000 -> error(not_killed) end,
        Count = count(Results),
        ?debugFmt("kill under load: ~p, the load ending ~b ms after the kill",
                  [Count, End - Killed]),
        ?assertEqual(12000, length(Results)),
        ?assertEqual([], maps:keys(maps:without([right, {node_down, N3}], Count))),
        %% A load still running well after the kill had jobs in flight on the killed node
        %% then: at least one of them answers node_down. One that ended about as the kill
        %% came may have had none left there.
        ?assert(End < Killed + 300 orelse maps:get({node_down, N3}, Count, 0) > 0),
        %% the rest of the cluster serves; the dead node is gone from it
        ok = erlcuda_test_util:wait_until(fun() -> not maps:is_key(N3, erlcuda:info(cluster))
                                          end, 50),
        ?assertEqual({error, {bad_node, N3}}, erlcuda:launch(reduce, [[1.0]], [{node, N3}])),
        %% a buffer of the dead node went with it: freeing it is ok, as for a lost one
        %% (not `remote_buffer')
        ?assertEqual(ok, erlcuda:free(B3)),
        [?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N}]))
         || N <- [N1, N2]],
        _ = [jobs(P) || P <- [P1, P2]],
        records_gone()
    after
        application:unset_env(erlcuda, cluster_exclude)
    end.

%% Jobs launched with at most 4 in flight; each one's outcome: `right', `{wrong, R}',
%% an error, `lost' (no reply) or `duplicated' (a second reply).
async_caller(C, Jobs) ->
    Outcomes = async(C, 1, Jobs, #{}, []),
    receive {erlcuda, _, _} -> [duplicated | Outcomes] after 200 -> Outcomes end.

async(_, I, Jobs, InFlight, Acc) when I > Jobs, map_size(InFlight) =:= 0 ->
    Acc;
async(C, I, Jobs, InFlight, Acc) when I =< Jobs, map_size(InFlight) < 4 ->
    V = [float(C), float(I)],
    case erlcuda:launch(vector_add, [V, V], [{node, any}]) of
        {ok, Id} -> async(C, I + 1, Jobs, InFlight#{Id => {C, I}}, Acc);
        {error, E} -> async(C, I + 1, Jobs, InFlight, [E | Acc])
    end;
async(C, I, Jobs, InFlight, Acc) ->
    receive
        {erlcuda, Id, R} when is_map_key(Id, InFlight) ->
            {C, J} = maps:get(Id, InFlight),
            Outcome = case R of
                          {ok, [X, Y]} when X == 2 * C, Y == 2 * J -> right;
                          {ok, _} -> {wrong, R};
                          {error, E} -> E
                      end,
            async(C, I, Jobs, maps:remove(Id, InFlight), [Outcome | Acc]);
        {erlcuda, _, _} ->
            async(C, I, Jobs, InFlight, [duplicated | Acc])
    after 30000 ->
            Acc ++ [lost || _ <- maps:keys(InFlight)]
    end.

join(#{peers := [{_, N1}, {_, N2} | _]}) ->
    {P4, N4} = start_peer(),
    ok = application:set_env(erlcuda, cluster_exclude, [node()]),
    try
        ok = wait_cluster([N4]),
        %% (its devices may have run the quiet jobs of its transport probe)
        Before = jobs(P4),
        ?assertEqual(lists:duplicate(600, right),
                     callers(200, 3, fun(_, _) -> [{node, any}] end)),
        Shares = lists:zipwith(fun(A, B) -> A - B end, jobs(P4), Before),
        ?debugFmt("the new node's devices took ~w of 600 jobs", [Shares]),
        [?assert(S > 0) || S <- Shares],
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N4}])),
        [?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{node, N}]))
         || N <- [N1, N2]]
    after
        application:unset_env(erlcuda, cluster_exclude),
        catch peer:stop(P4)
    end.

count(List) ->
    lists:foldl(fun(R, Acc) -> maps:update_with(R, fun(X) -> X + 1 end, 1, Acc) end, #{},
                List).

doc_examples(_) ->
    Examples = [E || {_, cluster, _} = E <- erlcuda_doc_examples_tests:examples()],
    ?assert(length(Examples) >= 1),
    [(erlcuda_doc_examples_tests:run(Code))() || {_, _, Code} <- Examples].
