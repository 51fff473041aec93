%% The protocol (erlcuda_protocol) between this side and the worker: the launch frame's bytes,
%% the decoding of result records (the general path's, and a frame naming an unknown atom), and,
%% through the application, what the port owner makes of the worker's results - large results
%% beside small jobs, small binary results that must not pin their frame, and a hostile
%% worker's records (unknown ids, duplicates, records cut short or not fitting their job,
%% compressed error payloads). CPU backend, the worker's test double (test/worker) or a
%% stand-in worker.
-module(erlcuda_protocol_tests).

-include_lib("eunit/include/eunit.hrl").

-include("erlcuda_contract.hrl").

-define(B(Node, Epoch, Device, Id, Type, N), {erlcuda_buffer, Node, Epoch, Device, Id, Type, N}).

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).

%% An atom no module knows: written here only as a string, never as an atom literal.
-define(NEVER_ATOM, "erlcuda_protocol_tests_never_an_atom").

%% The tests through the application load the pipe with large results: shared memory,
%% which would take those off the pipe, is off.
with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, [{shm_dir, none} | Env], Test).

%%% The launch frame.

plain_frame_is_byte_identical_test() ->
    Data = <<1.0:32/float-little, 2.0:32/float-little>>,
    {ok, Frame} = erlcuda_protocol:encode_launch(7, 1, matmul, [Data, Data, 1, 1, 2],
                                                 #{trace => false,
                                                   result_file => {<<"s12">>, 3145728}}),
    Head = <<?WIRE_LAUNCH, 7:64, 1:16, ?WIRE_FLAG_RESULT_FILE, 6, "matmul", 5>>,
    Vec = <<?WIRE_ARG_VECTOR, 0, 8:64, Data/binary>>,
    %% the result slot last: its part size and name
    ?assertEqual(<<Head/binary, Vec/binary, Vec/binary, ?WIRE_ARG_DIM, 1:64,
                   ?WIRE_ARG_DIM, 1:64, ?WIRE_ARG_DIM, 2:64, 3145728:64, 3, "s12">>,
                 body(Frame)).

%% A frame's bytes after its length, which must be theirs.
body(Frame) ->
    <<Len:32, Body/binary>> = iolist_to_binary(Frame),
    ?assertEqual(Len, byte_size(Body)),
    Body.

general_frame_test() ->
    Args = [{vector, f64, <<1.0:64/float-little>>}, {handle, 42},
            {scalar, i32, <<5:32/little, 0:32>>}, {empty, u8, 9},
            {file, i64, <<"i3-1">>, 80, 1048576}],
    {ok, Frame} = erlcuda_protocol:encode_launch(
                    3, 0, k, Args, #{trace => true, result_file => false, keep => [100, 101],
                                     geometry => {{4, 2, 1}, {128, 1, 1}, 64}}),
    Flags = ?WIRE_FLAG_TRACE bor ?WIRE_FLAG_KEEP bor ?WIRE_FLAG_GEOMETRY,
    ?assertEqual(<<?WIRE_LAUNCH, 3:64, 0:16, Flags, 1, "k", 5,
                   ?WIRE_ARG_VECTOR, 1, 8:64, 1.0:64/float-little,
                   ?WIRE_ARG_HANDLE, 42:64,
                   ?WIRE_ARG_SCALAR, 2, 5:32/little, 0:32,
                   ?WIRE_ARG_EMPTY, 5, 9:64,
                   ?WIRE_ARG_FILE, 4, 80:64, 1048576:64, 4, "i3-1",
                   2, 100:64, 101:64,
                   4:32, 2:32, 1:32, 128:32, 1:32, 1:32, 64:32>>,
                 body(Frame)).

%% A caller that wants floats asks for them (flags.floats): that flag alone is added.
floats_frame_test() ->
    Data = <<1.0:32/float-little>>,
    Frame = fun(F) ->
                    {ok, Io} = erlcuda_protocol:encode_launch(
                                 2, 0, reduce, [Data], #{trace => false, result_file => false,
                                                         floats => F}),
                    body(Io)
            end,
    <<?WIRE_LAUNCH, 2:64, 0:16, Flags, Rest/binary>> = Frame(true),
    ?assertEqual({?WIRE_FLAG_FLOATS, <<?WIRE_LAUNCH, 2:64, 0:16, 0, Rest/binary>>},
                 {Flags, Frame(false)}).

%%% Result records and frames from the worker, decoded without a worker.

ctx(Shape) ->
    #{epoch => 9, device => 1, buffers => [?B(node(), 9, 1, 77, f32, 3)], shape => Shape,
      keep => []}.

decode_test() ->
    Msg = fun(Tag, Payload, Format, Sync, Ctx) ->
                  element(3, erlcuda_protocol:message(1, {wire, Tag, Payload}, Format, Sync,
                                                      Ctx))
          end,
    I32 = <<(-1):32/little, 2:32/little>>,
    T = <<2, I32/binary>>,
    ?assertEqual({ok, [-1, 2]}, Msg(?WIRE_TAG_TYPED, T, list, false, none)),
    ?assertEqual({ok, I32}, Msg(?WIRE_TAG_TYPED, T, binary, true, none)),
    %% a launch_sync caller makes its own lists
    {deferred, Raw} = Msg(?WIRE_TAG_TYPED, T, list, true, none),
    ?assertEqual({ok, [-1, 2]}, erlcuda_protocol:finish(Raw, list)),
    ?assertMatch({error, {internal, _}}, Msg(?WIRE_TAG_TYPED, <<2, 1, 2, 3>>, list, false, none)),
    ?assertMatch({error, {internal, _}}, Msg(?WIRE_TAG_TYPED, <<9, 1>>, list, false, none)),
    ?assertMatch({error, {non_finite, _}},
                 Msg(?WIRE_TAG_TYPED, <<1, 0, 0, 0, 0, 0, 0, 240, 127>>, list, false, none)),
    H = <<5:64, 1, 4:64>>,
    Handle = ?B(node(), 9, 1, 5, f64, 4),
    ?assertEqual({ok, Handle}, Msg(?WIRE_TAG_HANDLE, H, list, true, ctx(value))),
    Item = fun(Tag, P) -> <<Tag, (byte_size(P)):32, P/binary>> end,
    L = <<2:32, (Item(?WIRE_TAG_VECTOR, <<1.0:32/float-little>>))/binary,
          (Item(?WIRE_TAG_HANDLE, H))/binary>>,
    ?assertEqual({ok, [[1.0], Handle]}, Msg(?WIRE_TAG_LIST, L, list, false, ctx(list))),
    {deferred, RawL} = Msg(?WIRE_TAG_LIST, L, list, true, ctx(list)),
    ?assertEqual({ok, [[1.0], Handle]}, erlcuda_protocol:finish(RawL, list)),
    %% an elementwise kernel's one output comes as it is; a raw kernel's always as a list
    L1 = <<1:32, (Item(?WIRE_TAG_HANDLE, H))/binary>>,
    ?assertEqual({ok, Handle}, Msg(?WIRE_TAG_LIST, L1, list, false, ctx(single))),
    ?assertEqual({ok, Handle}, Msg(?WIRE_TAG_HANDLE, H, list, false, ctx(single))),
    ?assertEqual({ok, [Handle]}, Msg(?WIRE_TAG_HANDLE, H, list, false, ctx(list))),
    ?assertMatch({error, {internal, _}}, Msg(?WIRE_TAG_LIST, <<3:32>>, list, false, ctx(list))),
    %% the worker names a lost buffer by its id: the caller gets its handle
    Lost = term_to_binary({buffer_lost, 77}),
    ?assertEqual({error, {buffer_lost, ?B(node(), 9, 1, 77, f32, 3)}},
                 Msg(?WIRE_TAG_ERROR, Lost, list, false, ctx(value))),
    ?assertEqual({error, {buffer_lost, 78}},
                 Msg(?WIRE_TAG_ERROR, term_to_binary({buffer_lost, 78}), list, false,
                     ctx(value))),
    %% the built-in kernels' records
    V = <<1.0:32/float-little>>,
    ?assertEqual({f32, V}, Msg(?WIRE_TAG_VECTOR, V, list, true, none)),
    ?assertEqual({ok, [1.0]}, Msg(?WIRE_TAG_VECTOR, V, list, false, none)),
    ?assertEqual({ok, 2.5}, Msg(?WIRE_TAG_SCALAR, <<2.5:64/float-little>>, list, true, none)).

%% An f32 vector sent as floats (flags.floats): the ETF of their list, which a launch_sync
%% caller decodes itself, in one call; an infinity or NaN in it is `non_finite', as in a raw
%% vector; a payload that is no list of that many floats is the worker's fault.
floats_record_test() ->
    Msg = fun(Payload, Sync) ->
                  element(3, erlcuda_protocol:message(1, {wire, ?WIRE_TAG_FLOATS, Payload},
                                                      list, Sync, none))
          end,
    Etf = term_to_binary([1.0, -2.5, 0.0]),
    ?assertMatch(<<131, 108, 3:32, 70, _:64, _/binary>>, Etf),
    {floats, Sent} = Msg(Etf, true),
    ?assertEqual({ok, [1.0, -2.5, 0.0]}, erlcuda_await:result({floats, Sent})),
    ?assertEqual({ok, [1.0, -2.5, 0.0]}, Msg(Etf, false)),
    ?assertEqual({ok, []}, Msg(<<131, 108, 0:32, 106>>, false)),
    Inf = <<131, 108, 2:32, 70, 1.0:64/float, 70, 16#7FF0000000000000:64, 106>>,
    ?assertMatch({error, {non_finite, _}}, Msg(Inf, false)),
    ?assertMatch({error, {non_finite, _}}, erlcuda_await:result(Msg(Inf, true))),
    %% nine bytes an item, but no floats; a count its length does not hold
    Ints = <<131, 108, 1:32, 98, 7:32, 97, 1, 97, 2, 106>>,
    ?assertEqual(byte_size(Etf) - 2 * 9, byte_size(Ints)),
    ?assertMatch({error, {internal, _}}, Msg(Ints, false)),
    %% a proper list of the payload's length whose items are no floats; a term that ends
    %% before the payload does
    ?assertMatch({error, {internal, _}},
                 Msg(<<131, 108, 1:32, 109, 4:32, "abcd", 106>>, false)),
    ?assertMatch({error, {internal, _}},
                 erlcuda_await:result(Msg(<<131, 108, 1:32, 109, 4:32, "abcd", 106>>, true))),
    ?assertMatch({error, {internal, _}}, Msg(<<131, 108, 1:32, 97, 5, 106, 0:56>>, false)),
    ?assertMatch({error, {internal, _}}, Msg(<<131, 108, 2:32, 70, 1.0:64/float, 106>>, false)),
    ?assertMatch({error, {internal, _}},
                 element(3, erlcuda_protocol:message(1, {wire, ?WIRE_TAG_FLOATS, Etf}, binary,
                                                     true, none))),
    ?assert(erlcuda_protocol:fits({vector, f32, 3}, {wire, ?WIRE_TAG_FLOATS, Etf})),
    ?assertNot(erlcuda_protocol:fits({vector, f32, 2}, {wire, ?WIRE_TAG_FLOATS, Etf})).

%% Through the worker: a caller of `{format, list}' is sent the ETF of its floats, one of
%% `{format, binary}' the raw f32 values; both read the same numbers.
floats_from_the_worker_test_() ->
    with_app([], {timeout, 60, fun() ->
        L = [float(I) / 4 || I <- lists:seq(1, 100)],
        Sent = fun(Format) ->
                       {ok, Job} = erlcuda_job:validate(vector_add, [L, L], [{format, Format}]),
                       Alias = alias([explicit_unalias]),
                       {ok, _, _} = erlcuda_submit:submit(Job#{quiet => true}, Alias),
                       receive {erlcuda, Alias, R} -> unalias(Alias), R
                       after 10000 -> no_reply
                       end
               end,
        {floats, Etf} = Sent(list),
        {ok, Bin} = Sent(binary),
        Want = [X * 2 || X <- L],
        ?assertEqual({ok, Want}, erlcuda_protocol:float_list(Etf)),
        ?assertEqual({ok, Want}, erlcuda_vector:unpack(f32, Bin)),
        ?assertEqual({ok, Want}, erlcuda:launch_sync(vector_add, [L, L])),
        ?assertMatch({error, {non_finite, _}},
                     erlcuda:launch_sync(vector_add, [[3.0e38], [3.0e38]]))
    end}).

%% [safe] decoding: a frame naming an atom the node does not know is dropped as
%% undecodable, and no atom is made.
no_atom_from_worker_test() ->
    Name = list_to_binary("erlcuda_protocol_tests_" ++ integer_to_list(erlang:unique_integer([positive]))),
    Before = erlang:system_info(atom_count),
    Frame = <<131, 104, 3, 119, 1, $r, 97, 1, 119, (byte_size(Name)), Name/binary>>,
    ?assertEqual({undecodable, byte_size(Frame)}, erlcuda_protocol:decode(Frame)),
    Log = <<131, 104, 3, 119, 1, $L, 119, 2, "ok", 109, 0, 0, 0, 1, "x">>,
    ?assertMatch({log, info, <<"x">>}, erlcuda_protocol:decode(Log)),
    ?assertEqual(Before, erlang:system_info(atom_count)).

%%% What the port owner does per result.

%% A large vector result delivered on device 0 (a {format, binary} result forwarded as a
%% sub-binary by the port owner, or a launch_sync list its caller makes) while a caller
%% loops small jobs on device 1: the big result arrives whole and every small job is
%% answered right. How long the small jobs wait meanwhile is measured by bench/run's hold
%% section, not here: a shared CI machine gives no stable timing.
large_results_are_delivered_beside_small_jobs_test_() ->
    with_app([], {timeout, 60, fun() ->
        Self = self(),
        V = binary:copy(<<1.0:32/float-little>>, 1 bsl 22),
        lists:foreach(
          fun(Launch) ->
                  spawn(fun() -> Self ! {big, Launch(V)} end),
                  small_jobs_until_big(erlang:monotonic_time(millisecond) + 40000)
          end,
          [fun(A) ->
                   {ok, Id} = erlcuda:launch(vector_add, [A, A], [{device, 0}, {format, binary}]),
                   receive {erlcuda, Id, {ok, B}} -> byte_size(B) div 4 after 40000 -> lost end
           end,
           fun(A) ->
                   {ok, L} = erlcuda:launch_sync(vector_add, [A, A], [{device, 0}, {timeout, 40000}]),
                   length(L)
           end])
    end}).

%% Small jobs on device 1, each answered right, until the big result came whole.
small_jobs_until_big(Deadline) ->
    receive
        {big, N} -> ?assertEqual(1 bsl 22, N)
    after 0 ->
        case erlang:monotonic_time(millisecond) > Deadline of
            true -> error(big_job_lost);
            false ->
                ?assertEqual({ok, 1.0},
                             erlcuda:launch_sync(reduce, [[1.0]], [{device, 1}, {timeout, 40000}])),
                small_jobs_until_big(Deadline)
        end
    end.

%% Every {format, binary} vector result is cut from the whole results frame: a caller that
%% keeps a 128-byte result must not keep alive the frame of the lane's whole batch - here
%% 16 MiB of another caller's result. Results kept (a cache, an ETS table, a gen_server's
%% state) would pin frames of up to 4 GiB each.
small_binary_result_does_not_pin_the_results_frame_test_() ->
    with_app([], {timeout, 30, fun() ->
        Self = self(),
        erlcuda_test_util:stall(0, 400),
        V = binary:copy(<<1.0:32/float-little>>, 1 bsl 22),
        spawn(fun() ->
                      {ok, Id} = erlcuda:launch(vector_add, [V, V], [{format, binary}]),
                      receive {erlcuda, Id, _} -> Self ! big_done after 10000 -> ok end
              end),
        timer:sleep(20),
        S = lists:duplicate(32, 1.0),
        {ok, Small} = erlcuda:launch_sync(vector_add, [S, S], [{format, binary}]),
        receive big_done -> ok after 10000 -> ok end,
        receive {stalled, _} -> ok after 5000 -> ok end,
        erlang:garbage_collect(),
        ?debugFmt("a ~b-byte result keeps ~b bytes alive",
                  [byte_size(Small), binary:referenced_byte_size(Small)]),
        ?assert(binary:referenced_byte_size(Small) < 1 bsl 20)
    end}).

%%% A hostile worker's results frames.
%%
%% The fake worker answers every control call (hello included) with a valid hello map and
%% answers each launch of reduce([S]) with the records of scenario S (see fake_worker/0).

%% Unknown job ids, a record twice (in one frame and in a later one), an error payload
%% naming an atom the node does not know, one that is not ETF, +inf: each real job gets
%% exactly one reply, the port owner survives, no atom is made.
hostile_results_records_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 30, fun() ->
        Owner = whereis(erlcuda_worker),
        Sync = fun(S) -> erlcuda:launch_sync(reduce, [[float(S)]], [{timeout, 3000}]) end,
        ?assertEqual({ok, 42.0}, Sync(1)),
        ?assertEqual({ok, 2.0}, Sync(2)),
        ?assertEqual({ok, 5.0}, Sync(5)),
        ?assertMatch({error, {internal, _}}, Sync(7)),
        ?assertError(badarg, list_to_existing_atom(?NEVER_ATOM)),
        ?assertMatch({error, {internal, _}}, Sync(8)),
        ?assertMatch({error, {non_finite, _}}, Sync(11)),
        %% async: exactly one message each
        Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[float(S)]]), Id end
               || S <- [1, 2, 5, 7, 8, 11]],
        Got = [receive {erlcuda, Id, _} -> Id after 3000 -> lost end || Id <- Ids],
        ?assertEqual(Ids, Got),
        timer:sleep(300),
        no_message(),
        ?assertEqual(0, erlcuda_jobs:size()),
        ?assertEqual(Owner, whereis(erlcuda_worker)),
        ?assertMatch(#{restarts := 0}, erlcuda:info())
    end}).

%% Records that do not fit the job they name: a wrong tag, a scalar of 4 bytes, a vector
%% answering a reduce, a vector of 3 elements answering a vector_add of 4, a buffer the job
%% was not to keep answering a copy that keeps (another caller's). Each such job is
%% answered `{error, {internal, _}}' once (never a list for a reduce, never three elements
%% for a vector_add of four), and the worker that confused them is restarted.
records_that_do_not_fit_their_job_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 60, fun() ->
        Owner = whereis(erlcuda_worker),
        Jobs = [{reduce, [[3.0]], []}, {reduce, [[9.0]], []}, {reduce, [[12.0]], []},
                {vector_add, [[13.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], []},
                {copy, [[14.0]], [{keep, true}]}],
        lists:foreach(
          fun({Kernel, Args, Opts}) ->
                  #{worker_os_pid := Os} = erlcuda:info(),
                  ?assertMatch({error, {internal, _}},
                               erlcuda:launch_sync(Kernel, Args, [{timeout, 5000} | Opts])),
                  erlcuda_test_util:wait_restarted(Os, 100)
          end, Jobs),
        ?assertEqual(0, erlcuda_buffers:count()),
        {ok, Id} = erlcuda:launch(reduce, [[12.0]]),
        ?assertMatch({error, {internal, _}},
                     receive {erlcuda, Id, R} -> R after 5000 -> no_reply end),
        timer:sleep(300),
        no_message(),
        ?assertEqual(Owner, whereis(erlcuda_worker))
    end}).

%% A record cut short, or one whose Len runs past the frame (0xFFFFFFFF): the job whose
%% header was readable is answered all the same and leaves the job table, with its place in
%% the device queue; else it would stay registered for as long as the worker keeps talking
%% (the watchdog looks only at silence) and an async caller would wait for ever.
malformed_record_still_answers_its_job_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 30, fun() ->
        {ok, Cut} = erlcuda:launch(reduce, [[4.0]]),
        {ok, Huge} = erlcuda:launch(reduce, [[6.0]]),
        Got = [receive {erlcuda, Id, R} -> R after 3000 -> no_reply end || Id <- [Cut, Huge]],
        Left = erlcuda_jobs:size(),
        ?assertEqual({[false, false], 0}, {[R =:= no_reply || R <- Got], Left})
    end}).

%% An error payload of compressed ETF (tag 80) claims whatever size its header says: a
%% record of about 256 KiB inflating to a 256 MiB term (x1000; a 4 MiB record, 4 GiB; one per
%% job in flight, enough to take the node down). The worker never compresses, and its own ETF
%% decoder bounds the deflate ratio (etf.MAX_DEFLATE_RATIO); this side bounds the reply too.
compressed_error_payload_is_bounded_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 30, fun() ->
        R = erlcuda:launch_sync(reduce, [[10.0]], [{timeout, 10000}]),
        Size = erlang:external_size(R),
        ?debugFmt("reply to a compressed error record inflating to ~b MiB: ~b MiB",
                  [fake_bomb_mib(), Size bsr 20]),
        ?assert(Size < 16 bsl 20)
    end}).

no_message() -> erlcuda_test_util:no_message().

fake_bomb_mib() -> 256.

%% A stand-in worker: every control call is answered with a valid hello map; a launch of
%% reduce([S]) (alone or in a batch frame) is answered with scenario S's records:
%%   1 its result, 42.0            2 a record for an unknown job id, then its result, 2.0
%%   3 a record with tag 'Z'       4 a record cut short (Len 8, 4 bytes follow)
%%   5 its result 5.0 twice in one frame, and once more in a second frame
%%   6 a record whose Len is 0xFFFFFFFF                      7 an error naming a new atom
%%   8 an error payload that is not ETF                      9 a scalar of 4 bytes
%%  10 an error payload of compressed ETF inflating to 256 MiB      11 a scalar +inf
%%  12 an f32 vector of 4 elements                                 13 one of 3 elements
%%  14 a buffer of id 2^62
fake_worker() ->
    erlcuda_test_util:fake_worker(
      "fake_worker", 2,
      ["NEVER = b'", ?NEVER_ATOM, "'\n"
       "BOMB_MIB = ", integer_to_list(fake_bomb_mib()), "\n"], [
"def results(*records):\n"
"    send(b'R' + struct.pack('>I', len(records)) + b''.join(records))\n"
"def rec(job, tag, payload, n=None):\n"
"    return struct.pack('>QBI', job, tag, len(payload) if n is None else n) + payload\n"
"def f64(x):\n"
"    return struct.pack('<d', x)\n"
"S, E = ord('s'), ord('e')\n"
"def bomb():\n"
"    n = BOMB_MIB << 20\n"
"    term = b'h\\x02w\\x08bad_argsm' + struct.pack('>I', n)\n"
"    z = zlib.compressobj(9)\n"
"    out = z.compress(term)\n"
"    zeros = bytes(1 << 20)\n"
"    for _ in range(BOMB_MIB):\n"
"        out += z.compress(zeros)\n"
"    out += z.flush()\n"
"    return b'\\x83P' + struct.pack('>I', len(term) + n) + out\n"
"def answer(j, s):\n"
"    if s == 1: results(rec(j, S, f64(42.0)))\n"
"    elif s == 2: results(rec(j + (1 << 40), S, f64(1.0)), rec(j, S, f64(2.0)))\n"
"    elif s == 3: results(rec(j, ord('Z'), f64(3.0)))\n"
"    elif s == 4: results(rec(j, S, f64(4.0), 8)[:-4])\n"
"    elif s == 5:\n"
"        results(rec(j, S, f64(5.0)), rec(j, S, f64(5.5)))\n"
"        results(rec(j, S, f64(5.7)))\n"
"    elif s == 6: results(rec(j, S, f64(6.0), 0xFFFFFFFF))\n"
"    elif s == 7: results(rec(j, E, b'\\x83h\\x02w\\x08bad_argsw' + bytes((len(NEVER),)) + NEVER))\n"
"    elif s == 8: results(rec(j, E, b'not an external term'))\n"
"    elif s == 9: results(rec(j, S, b'\\x00\\x00\\x80\\x7f'))\n"
"    elif s == 10: results(rec(j, E, bomb()))\n"
"    elif s == 11: results(rec(j, S, f64(float('inf'))))\n"
"    elif s == 12: results(rec(j, ord('v'), bytes(16)))\n"
"    elif s == 13: results(rec(j, ord('v'), bytes(12)))\n"
"    elif s == 14: results(rec(j, ord('h'), struct.pack('>QBQ', 1 << 62, 0, 1)))\n"
"def launch(m):\n"
"    answer(m.job_id, int(m.args[0][0]) if m.args and len(m.args[0]) else 0)\n"]).
