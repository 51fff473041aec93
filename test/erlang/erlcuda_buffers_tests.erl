%% Typed vectors and device buffers on the CPU backend (two virtual devices): round trips in
%% every element type, the built-in kernels in f64, chains of kernels on buffers, the errors
%% of wrong, remote and stale handles, ownership (free, give, an owner's death), memory back
%% to its baseline after many owners die, the buffer limit, and a worker restart.
-module(erlcuda_buffers_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()},
                   {buffer_limit, infinity}]).
-define(TOL, 1.0e-12).

with_app(Env, Tests) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Tests).

buffers_test_() ->
    with_app([], [{"round trips in every type", fun round_trips/0},
                  {"range and shape errors", fun range_errors/0},
                  {"the built-in kernels in f64", fun f64_kernels/0},
                  {"a chain of kernels on buffers", fun chain/0},
                  {"zeros and empty", fun allocations/0},
                  {"async launches keep results", fun async_keep/0},
                  {"wrong, remote and stale handles", fun bad_handles/0},
                  {"forged handles and improper options", fun forged/0},
                  {"free", fun free/0},
                  {"give", fun give/0},
                  {"an owner's death frees its buffers", fun owner_dies/0},
                  {"1000 owners that die without freeing", {timeout, 120, fun many_owners/0}},
                  {"a launch_sync timeout frees what it kept",
                   {timeout, 30, fun timeout_frees/0}},
                  {"info", fun info/0},
                  {"a worker restart loses its buffers", {timeout, 60, fun restart/0}}]).

new_node_life_test_() ->
    with_app([], {timeout, 60, fun new_node_life/0}).

limit_test_() ->
    with_app([{buffer_limit, 4096}], [{"buffer_limit", fun limit/0}]).

%% A node started again under its old name (after a crash) must never take a handle of its
%% earlier life for one of its own buffers: it would read and write another process's data.
%% What outlives the application but not the node is dropped here, as a new life of the
%% node starts without it; the first buffer of the new life then has the old one's device,
%% type, length and (both counting from the start) id.
new_node_life() ->
    new_life(),
    {ok, Old} = erlcuda:upload([1.0, 2.0, 3.0]),
    new_life(),
    Self = self(),
    Other = spawn(fun() ->
                          Self ! {theirs, erlcuda:upload([9.0, 9.0, 9.0])},
                          receive stop -> ok end
                  end),
    {ok, Theirs} = receive {theirs, R} -> R after 10000 -> error(no_upload) end,
    try
        ?assertNotEqual(Old, Theirs),
        ?assertMatch({error, {buffer_lost, _}}, erlcuda:download(Old)),
        ?assertMatch({error, {buffer_lost, _}}, erlcuda:launch_sync(copy, [Old])),
        ?assertEqual({ok, [9.0, 9.0, 9.0]}, erlcuda:download(Theirs))
    after
        Other ! stop
    end.

new_life() ->
    ok = application:stop(erlcuda),
    _ = [persistent_term:erase(K) || {{M, _} = K, _} <- persistent_term:get(),
                                     lists:member(M, [erlcuda_status, erlcuda_buffers,
                                                      erlcuda_jobs])],
    {ok, _} = application:ensure_all_started(erlcuda).

%% Device 0's and 1's buffer counters, as the worker reports them, and this node's count
%% of registered buffers.
usage() ->
    #{device_info := Devices, owned_buffers := Owned} = erlcuda:info(),
    {[{maps:get(buffers, D), maps:get(buffer_bytes, D)} || D <- Devices], Owned}.

back_to(Baseline) ->
    ok = erlcuda_test_util:wait_until(fun() -> usage() =:= Baseline end, 300).

close(A, B) when is_list(A), is_list(B) ->
    length(A) =:= length(B) andalso lists:all(fun({X, Y}) -> close(X, Y) end, lists:zip(A, B));
close(A, B) ->
    abs(A - B) =< ?TOL * max(1.0, abs(B)).

round_trips() ->
    Base = usage(),
    Cases = [{f32, [1.5, -2.0, 0.0, 3.25]}, {f64, [1.0e300, -1.0e-300, 0.1, 7.0]},
             {i32, [-2147483648, 0, 2147483647]}, {u32, [0, 1, 4294967295]},
             {i64, [-9223372036854775808, 42, 9223372036854775807]}, {u8, [0, 128, 255]}],
    lists:foreach(
      fun({T, L}) ->
              {ok, B} = erlcuda:upload(L, [{type, T}]),
              Len = length(L),
              ?assertMatch(#{type := T, elements := Len, device := 0}, erlcuda:buffer_info(B)),
              Want = case T of
                         f32 -> [float(X) || X <- L];
                         f64 -> L;
                         _ -> L
                     end,
              ?assertEqual({ok, Want}, erlcuda:download(B)),
              {ok, Bin} = erlcuda_vector:pack(T, L),
              ?assertEqual({ok, Bin}, erlcuda:download(B, [{format, binary}])),
              %% a binary goes up as it is
              {ok, B2} = erlcuda:upload(Bin, #{type => T, device => 1}),
              ?assertMatch(#{device := 1, elements := Len}, erlcuda:buffer_info(B2)),
              ?assertEqual({ok, Want}, erlcuda:download(B2)),
              %% data of any type comes back through copy, without a buffer
              ?assertEqual({ok, Want}, erlcuda:launch_sync(copy, [L], [{type, T}])),
              ok = erlcuda:free(B),
              ok = erlcuda:free(B2)
      end, Cases),
    {ok, E} = erlcuda:upload([], [{type, u32}]),
    ?assertEqual({ok, []}, erlcuda:download(E)),
    ok = erlcuda:free(E),
    back_to(Base).

range_errors() ->
    Bad = [{[300], u8}, {[-1], u32}, {[1.5], i32}, {[1 bsl 31], i32}, {[1 bsl 63], i64},
           {[foo], f64}, {[1.0e39], f32}, {<<1, 2, 3>>, i32}, {<<1, 2, 3>>, f64},
           {{1.0}, f32}],
    [?assertMatch({error, {bad_args, _}}, erlcuda:upload(V, [{type, T}])) || {V, T} <- Bad],
    ?assertEqual({error, {bad_option, {type, f16}}}, erlcuda:upload([1], [{type, f16}])),
    ?assertEqual({error, {bad_option, nope}}, erlcuda:upload([1], nope)),
    ?assertMatch({error, {bad_args, _}}, erlcuda:zeros(f16, 3, [])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:zeros(f32, -1, [])),
    ?assertMatch({error, {bad_args, _}}, erlcuda:download(not_a_buffer)),
    ?assertMatch({error, {bad_args, _}}, erlcuda:free(not_a_buffer)),
    ?assertMatch({error, {bad_args, _}}, erlcuda:buffer_info(not_a_buffer)),
    %% the vector kernels run in f32 or f64 only
    ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(vector_add, [[1], [2]],
                                                            [{type, i32}])),
    ?assertEqual(0, erlcuda_buffers:count()),
    erlcuda_test_util:no_message().

f64_kernels() ->
    A = [1.0e200, 2.5, -3.0, 1.0e-200], B = [1.0e200, 0.5, 1.0, 4.0],
    ?assertEqual({ok, [2.0e200, 3.0, -2.0, 4.0]},
                 erlcuda:launch_sync(vector_add, [A, B], [{type, f64}])),
    {ok, S} = erlcuda:launch_sync(reduce, [[0.1, 0.2, 0.3]], [{type, f64}]),
    ?assert(close(S, 0.6)),
    ?assertEqual({ok, 2.0e200},
                 erlcuda:launch_sync(dot_product, [[1.0e100, 1.0e100], [1.0e100, 1.0e100]],
                                     [{type, f64}])),
    ?assertEqual({ok, [19.0, 22.0, 43.0, 50.0]},
                 erlcuda:launch_sync(matmul, [[1, 2, 3, 4], [5, 6, 7, 8], 2, 2, 2],
                                     [{type, f64}])),
    %% f64 binaries in and out
    Bin = <<1.0:64/float-little, 2.0:64/float-little>>,
    ?assertEqual({ok, <<2.0:64/float-little, 4.0:64/float-little>>},
                 erlcuda:launch_sync(vector_add, [Bin, Bin], [{type, f64}, {format, binary}])),
    %% a buffer of f64 sets the launch's type; data given with it is taken as f64
    {ok, X} = erlcuda:upload([1.0e300, 1.0], [{type, f64}]),
    ?assertEqual({ok, [2.0e300, 3.0]}, erlcuda:launch_sync(vector_add, [X, [1.0e300, 2]])),
    ?assertEqual({ok, 1.0e300 + 1.0}, erlcuda:launch_sync(reduce, [X])),
    ok = erlcuda:free(X),
    %% an infinity that an f64 cannot carry back as a float
    ?assertMatch({error, {non_finite, _}},
                 erlcuda:launch_sync(vector_add, [[1.0e308], [1.0e308]], [{type, f64}])),
    ?assertMatch({ok, <<_:64>>}, erlcuda:launch_sync(vector_add, [[1.0e308], [1.0e308]],
                                                     [{type, f64}, {format, binary}])),
    %% async callers get their lists made for them
    {ok, Id} = erlcuda:launch(vector_add, [[1], [2]], [{type, f64}]),
    receive {erlcuda, Id, R} -> ?assertEqual({ok, [3.0]}, R) after 5000 -> error(no_reply) end,
    erlcuda_test_util:no_message().

%% Three kernels on buffers, nothing through the port in between, then one download.
chain() ->
    Base = usage(),
    {M, K, N} = {2, 3, 2},
    {ok, A} = erlcuda:upload([1, 2, 3, 4, 5, 6], [{type, f64}]),
    {ok, B} = erlcuda:upload([1, 1, 1, 1, 1, 1], [{type, f64}]),
    {ok, C} = erlcuda:launch_sync(vector_add, [A, B], [{keep, true}]),   % 2..7
    ?assertMatch(#{type := f64, elements := 6, device := 0}, erlcuda:buffer_info(C)),
    {ok, D} = erlcuda:launch_sync(vector_add, [C, C], [{keep, true}]),   % 4..14
    {ok, E} = erlcuda:launch_sync(matmul, [D, B, M, N, K], [{keep, true}]),
    ?assertMatch(#{type := f64, elements := 4}, erlcuda:buffer_info(E)),
    %% rows of D: [4, 6, 8] and [10, 12, 14], times a 3 x 2 of ones
    ?assertEqual({ok, [18.0, 18.0, 36.0, 36.0]}, erlcuda:download(E)),
    ?assertEqual({ok, 108.0}, erlcuda:launch_sync(reduce, [E])),
    ?assertEqual({ok, 54.0}, erlcuda:launch_sync(dot_product, [D, B])),
    %% a device copy of a buffer is a new buffer
    {ok, F} = erlcuda:launch_sync(copy, [E], [{keep, true}]),
    ?assertNotEqual(E, F),
    ?assertEqual(erlcuda:download(E), erlcuda:download(F)),
    [ok = erlcuda:free(X) || X <- [A, B, C, D, E, F]],
    back_to(Base),
    erlcuda_test_util:no_message().

allocations() ->
    {ok, Z} = erlcuda:zeros(i64, 5, []),
    ?assertEqual({ok, [0, 0, 0, 0, 0]}, erlcuda:download(Z)),
    {ok, U} = erlcuda:empty(u8, 3, #{device => 1}),
    ?assertMatch(#{type := u8, elements := 3, device := 1, bytes := 3}, erlcuda:buffer_info(U)),
    {ok, L} = erlcuda:download(U),
    ?assertEqual(3, length(L)),
    %% zeros without keep are data
    ?assertEqual({ok, [0.0, 0.0]}, erlcuda:launch_sync(zeros, [2], [{type, f64}])),
    ok = erlcuda:free(Z),
    ok = erlcuda:free(U).

async_keep() ->
    {ok, A} = erlcuda:upload([1.0, 2.0], []),
    {ok, Id} = erlcuda:launch(vector_add, [A, A], [{keep, true}]),
    B = receive {erlcuda, Id, {ok, Buf}} -> Buf after 5000 -> error(no_reply) end,
    ?assertEqual({ok, [2.0, 4.0]}, erlcuda:download(B)),
    %% exactly one reply
    receive {erlcuda, Id, _} = Dup -> error({duplicate, Dup}) after 200 -> ok end,
    %% a keep launch refused here registers nothing
    Before = erlcuda_buffers:count(),
    ?assertEqual({error, {wrong_device, A}},
                 erlcuda:launch(vector_add, [A, [1.0, 2.0]], [{keep, true}, {device, 1}])),
    ?assertEqual(Before, erlcuda_buffers:count()),
    ok = erlcuda:free(A),
    ok = erlcuda:free(B),
    erlcuda_test_util:no_message().

bad_handles() ->
    {ok, B0} = erlcuda:upload([1.0, 2.0], []),
    {ok, B1} = erlcuda:upload([1.0, 2.0], [{device, 1}]),
    %% the launch runs on its buffers' device unless told otherwise
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [B1])),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [B1], [{device, any}])),
    ?assertEqual({error, {wrong_device, B1}}, erlcuda:launch_sync(reduce, [B1], [{device, 0}])),
    ?assertEqual({error, {wrong_device, B1}}, erlcuda:launch_sync(vector_add, [B0, B1])),
    ?assertEqual({error, {wrong_device, B1}}, erlcuda:launch(vector_add, [B0, B1])),
    {erlcuda_buffer, Node, Epoch, Dev, Id, Type, N} = B0,
    Remote = {erlcuda_buffer, 'elsewhere@nowhere', Epoch, Dev, Id, Type, N},
    ?assertEqual({error, {remote_buffer, Remote}}, erlcuda:launch_sync(reduce, [Remote])),
    ?assertEqual({error, {remote_buffer, Remote}}, erlcuda:download(Remote)),
    %% freed there when the connection to it dropped, if it ever was connected
    ?assertEqual(ok, erlcuda:free(Remote)),
    ?assertEqual({error, {remote_buffer, Remote}}, erlcuda:give(Remote, self())),
    ?assertMatch(#{node := 'elsewhere@nowhere', owner := undefined}, erlcuda:buffer_info(Remote)),
    %% a handle of an earlier worker
    Stale = {erlcuda_buffer, Node, Epoch - 1, Dev, Id, Type, N},
    ?assertEqual({error, {buffer_lost, Stale}}, erlcuda:launch_sync(reduce, [Stale])),
    ?assertEqual({error, {buffer_lost, Stale}}, erlcuda:download(Stale)),
    %% an id the worker does not hold
    Unknown = {erlcuda_buffer, Node, Epoch, Dev, Id + 1000000, Type, N},
    ?assertEqual({error, {buffer_lost, Unknown}}, erlcuda:launch_sync(reduce, [Unknown])),
    ok = erlcuda:free(B0),
    ok = erlcuda:free(B1),
    erlcuda_test_util:no_message().

free() ->
    Base = usage(),
    {ok, B} = erlcuda:upload([1, 2, 3], [{type, i32}]),
    Self = self(),
    %% only the owner frees
    spawn(fun() -> Self ! {other, erlcuda:free(B)} end),
    receive {other, R} -> ?assertEqual({error, not_owner}, R) after 5000 -> error(hung) end,
    ?assertEqual(self(), maps:get(owner, erlcuda:buffer_info(B))),
    ok = erlcuda:free(B),
    ?assertEqual(undefined, maps:get(owner, erlcuda:buffer_info(B))),
    ?assertEqual({error, {buffer_lost, B}}, erlcuda:download(B)),
    ?assertEqual({error, {buffer_lost, B}}, erlcuda:launch_sync(copy, [B], [{keep, true}])),
    %% freeing twice is fine
    ok = erlcuda:free(B),
    back_to(Base).

give() ->
    Base = usage(),
    Self = self(),
    Keeper = spawn(fun() -> receive stop -> ok end end),
    Maker = spawn(fun() ->
                          {ok, B} = erlcuda:upload([1.0, 2.0, 3.0], []),
                          ok = erlcuda:give(B, Keeper),
                          %% given away: no longer the maker's to give or free
                          Self ! {made, B, erlcuda:give(B, self()), erlcuda:free(B)}
                  end),
    B = receive {made, Buf, NotOwner1, NotOwner2} ->
                ?assertEqual({error, not_owner}, NotOwner1),
                ?assertEqual({error, not_owner}, NotOwner2),
                Buf
        after 5000 -> error(hung)
        end,
    Ref = monitor(process, Maker),
    receive {'DOWN', Ref, process, Maker, _} -> ok end,
    %% the maker's death did not free it
    timer:sleep(200),
    ?assertEqual({ok, [1.0, 2.0, 3.0]}, erlcuda:download(B)),
    ?assertEqual(Keeper, maps:get(owner, erlcuda:buffer_info(B))),
    ?assertMatch({error, {bad_args, _}}, erlcuda:give(B, not_a_pid)),
    %% the new owner's does
    Keeper ! stop,
    back_to(Base),
    ?assertEqual({error, {buffer_lost, B}}, erlcuda:download(B)),
    erlcuda_test_util:no_message().

owner_dies() ->
    Base = usage(),
    Self = self(),
    {Pid, Ref} = spawn_monitor(
                   fun() ->
                           {ok, A} = erlcuda:upload(lists:seq(1, 100), [{type, f64}]),
                           {ok, _} = erlcuda:zeros(u8, 1000, [{device, 1}]),
                           {ok, C} = erlcuda:launch_sync(vector_add, [A, A], [{keep, true}, {timeout, 60000}]),
                           Self ! {made, C, usage()},
                           receive never -> ok end
                   end),
    {C, During} = receive {made, Buf, U} -> {Buf, U} after 5000 -> error(hung) end,
    ?assertNotEqual(Base, During),
    {[{B0, _}, {B1, _}], _} = During,
    {[{Base0, _}, {Base1, _}], _} = Base,
    ?assertEqual({Base0 + 2, Base1 + 1}, {B0, B1}),
    %% another process may use it while its owner lives
    ?assertEqual({ok, 10100.0}, erlcuda:launch_sync(reduce, [C])),
    exit(Pid, kill),
    receive {'DOWN', Ref, process, Pid, _} -> ok end,
    back_to(Base),
    ?assertEqual({error, {buffer_lost, C}}, erlcuda:launch_sync(reduce, [C])).

%% The issue's load test: 1000 processes each upload, launch with keep and die without
%% freeing; the devices' memory comes back to its baseline.
many_owners() ->
    Base = usage(),
    #{device_info := Before} = erlcuda:info(),
    Self = self(),
    Pids = [spawn(fun() ->
                          Dev = I rem 2,
                          {ok, A} = erlcuda:upload([float(I) || _ <- lists:seq(1, 64)],
                                                   [{device, Dev}]),
                          {ok, C} = erlcuda:launch_sync(vector_add, [A, A], [{keep, true}, {timeout, 60000}]),
                          {ok, S} = erlcuda:launch_sync(reduce, [C], [{timeout, 60000}]),
                          Self ! {done, self(), S =:= 128.0 * I}
                  end) || I <- lists:seq(1, 1000)],
    ?assertEqual(lists:duplicate(1000, true),
                 [receive {done, P, Ok} -> Ok after 60000 -> error(hung) end || P <- Pids]),
    back_to(Base),
    #{device_info := After} = erlcuda:info(),
    %% the peak saw them: they were on the devices at all
    ?assert(lists:sum([maps:get(buffer_peak, D) || D <- After]) >
                lists:sum([maps:get(buffer_bytes, D) || D <- Before])),
    erlcuda_test_util:no_message().

timeout_frees() ->
    Base = usage(),
    erlcuda_test_util:stall(0, 800),
    ?assertEqual({error, timeout},
                 erlcuda:launch_sync(copy, [[1.0, 2.0]], [{keep, true}, {timeout, 50}])),
    receive {stalled, _} -> ok after 5000 -> error(stall) end,
    back_to(Base),
    %% and one that answered just at its deadline: whatever came back is freed
    ?assertEqual({error, timeout}, erlcuda:launch_sync(zeros, [3], [{keep, true},
                                                                      {timeout, 0}])),
    back_to(Base),
    timer:sleep(300),
    erlcuda_test_util:no_message().

info() ->
    Info = erlcuda:info(),
    ?assertMatch(#{epoch := E, owned_buffers := _} when is_integer(E) andalso E > 0, Info),
    [?assertMatch(#{buffers := _, buffer_bytes := _, buffer_peak := _, buffer_limit := 0}, D)
     || D <- maps:get(device_info, Info)].

restart() ->
    {ok, B} = erlcuda:upload([1.0, 2.0], []),
    {ok, Kept} = erlcuda:launch_sync(vector_add, [B, B], [{keep, true}]),
    #{worker_os_pid := Os, epoch := Epoch} = erlcuda:info(),
    os:cmd("kill -9 " ++ integer_to_list(Os)),
    erlcuda_test_util:wait_restarted(Os, 100),
    #{epoch := Epoch2} = erlcuda:info(),
    %% the registrations of the old worker are dropped
    ok = erlcuda_test_util:wait_until(fun() -> erlcuda_buffers:count() =:= 0 end, 50),
    ?assert(Epoch2 > Epoch),
    ?assertEqual({error, {buffer_lost, B}}, erlcuda:download(B)),
    ?assertEqual({error, {buffer_lost, Kept}}, erlcuda:launch_sync(vector_add, [Kept, B])),
    ?assertEqual(undefined, maps:get(owner, erlcuda:buffer_info(B))),
    ok = erlcuda:free(B),
    {ok, New} = erlcuda:upload([5, 6], [{type, u32}]),
    ?assertMatch({erlcuda_buffer, _, Epoch2, 0, _, u32, 2}, New),
    ?assertEqual({ok, [5, 6]}, erlcuda:download(New)),
    ok = erlcuda:free(New),
    erlcuda_test_util:no_message().

limit() ->
    Base = usage(),
    ?assertMatch(#{device_info := [#{buffer_limit := 4096} | _]}, erlcuda:info()),
    Big = lists:duplicate(2000, 1.0),
    ?assertMatch({error, {cuda, out_of_memory, _}}, erlcuda:upload(Big, [])),
    %% the node and the worker keep serving
    ?assertEqual({ok, 2000.0}, erlcuda:launch_sync(reduce, [Big])),
    ?assertEqual(Base, usage()),
    Kb2 = lists:duplicate(512, 1.0),
    {ok, A} = erlcuda:upload(Kb2, []),
    {ok, B} = erlcuda:upload(Kb2, []),
    ?assertMatch({error, {cuda, out_of_memory, _}}, erlcuda:upload(Kb2, [])),
    ?assertMatch({error, {cuda, out_of_memory, _}},
                 erlcuda:launch_sync(vector_add, [A, B], [{keep, true}])),
    {ok, Id} = erlcuda:launch(copy, [A], [{keep, true}]),
    receive {erlcuda, Id, R} -> ?assertMatch({error, {cuda, out_of_memory, _}}, R)
    after 5000 -> error(no_reply)
    end,
    %% a keep that failed in the worker leaves nothing registered
    ?assertEqual(2, erlcuda_buffers:count()),
    %% without keep, the result is data: no buffer needed
    ?assertEqual({ok, 512.0}, erlcuda:launch_sync(dot_product, [A, B])),
    ok = erlcuda:free(A),
    %% (the free runs on the device in its turn: a launch written after it may run first)
    {[{Base0, _} | _], _} = Base,
    ok = erlcuda_test_util:wait_until(
           fun() -> element(1, hd(element(1, usage()))) =:= Base0 + 1 end, 50),
    {ok, C} = erlcuda:upload(Kb2, []),
    [ok = erlcuda:free(X) || X <- [B, C]],
    back_to(Base),
    erlcuda_test_util:no_message().

%% A handle whose fields were changed by hand is refused, never read as it says (a changed
%% type must not return floats for an "i32" buffer, nor a changed device free the real
%% buffer on the other device); an improper option list is bad_option, not a crash.
forged() ->
    {ok, A} = erlcuda:upload([1.0, 2.0, 3.0], [{type, f64}]),
    {ok, B1} = erlcuda:upload([1.0], [{device, 1}]),
    [?assertMatch({error, {bad_args, _}}, R)
     || R <- [erlcuda:launch_sync(copy, [setelement(6, A, i32)]),
              erlcuda:download(setelement(7, A, 1 bsl 40)),
              erlcuda:buffer_info(setelement(6, A, u8)),
              erlcuda:free(setelement(4, B1, 0)),
              erlcuda:download(setelement(4, B1, 0))]],
    ?assertEqual({ok, [1.0, 2.0, 3.0]}, erlcuda:download(A)),
    ?assertEqual({ok, [1.0]}, erlcuda:download(B1)),
    [?assertMatch({error, {bad_option, _}}, R)
     || R <- [erlcuda:upload([1.0], [{type, f64} | foo]),
              erlcuda:download(A, [{format, binary} | bad]),
              erlcuda:zeros(f32, 2, [{device, 0} | bad]),
              erlcuda:empty(f32, 2, [{device, 0} | bad])]],
    ok = erlcuda:free(A),
    ok = erlcuda:free(B1),
    erlcuda_test_util:no_message().
