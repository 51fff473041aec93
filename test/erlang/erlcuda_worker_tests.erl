%% The port owner (erlcuda_worker) against workers that misbehave: what a frame header
%% makes this side keep, and worker arguments checked before a worker is started.
-module(erlcuda_worker_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"}, {python_path, []}, {python, default},
                   {start_timeout, 120000}, {worker_args, []}]).

%% The port owner's log events carry `domain => [erlcuda]', so a handler or filter can
%% take erlcuda's apart.
log_domain_test_() ->
    {setup,
     fun() -> _ = application:stop(erlcuda) end,
     fun(_) ->
             _ = logger:remove_handler(erlcuda_log_domain),
             erlcuda_test_util:reset(?DEFAULTS, [])
     end,
     {timeout, 60, fun() ->
         ok = logger:add_handler(erlcuda_log_domain, erlcuda_test_util,
                                 #{config => #{pid => self()}, level => all}),
         application:load(erlcuda),
         [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
         {ok, _} = application:ensure_all_started(erlcuda),
         Started = fun F() ->
                           receive
                               {logged, #{msg := {Format, _}, meta := Meta}} ->
                                   case string:find(Format, "started") of
                                       nomatch -> F();
                                       _ -> Meta
                                   end;
                               {logged, _} -> F()
                           after 10000 -> none
                           end
                   end,
         ?assertMatch(#{domain := [erlcuda]}, Started())
     end}}.

%% The worker's start is logged once, by the port owner, with the backend's reason: the
%% worker logged that reason too, before its hello, so every start read twice.
start_logged_once_test_() ->
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             %% the worker's line was at level info, below the default primary level
             #{level := Level} = logger:get_primary_config(),
             ok = logger:set_primary_config(level, info),
             Level
     end,
     fun(Level) ->
             ok = logger:set_primary_config(level, Level),
             _ = logger:remove_handler(erlcuda_start_once),
             erlcuda_test_util:reset(?DEFAULTS, [])
     end,
     {timeout, 60, fun() ->
         ok = logger:add_handler(erlcuda_start_once, erlcuda_test_util,
                                 #{config => #{pid => self()}, level => all,
                                   filters => [{erlcuda, {fun logger_filters:domain/2,
                                                          {log, sub, [erlcuda]}}}],
                                   filter_default => stop}),
         application:load(erlcuda),
         [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
         {ok, _} = application:ensure_all_started(erlcuda),
         %% Every event up to the "started" one: the worker's frames before its hello
         %% answer are handled before it.
         Upto = fun F(Acc) ->
                        receive
                            {logged, #{msg := {Format, Args}}} ->
                                Text = iolist_to_binary(io_lib:format(Format, Args)),
                                case string:find(Text, "started") of
                                    nomatch -> F([Text | Acc]);
                                    _ -> [Text | Acc]
                                end;
                            {logged, _} -> F(Acc)
                        after 10000 -> Acc
                        end
                end,
         Events = Upto([]),
         ?assertMatch([_], [E || E <- Events, string:find(E, "cpu backend requested") =/= nomatch])
     end}}.

%% A worker whose first bytes are a frame header of 0xFFFFFFF0 and nothing after: a
%% `{packet, 4}' port reserved the 4 GiB it names at once (and kept them after the
%% application stopped). Now a frame takes the memory of the bytes that came.
frame_header_reserves_nothing_test_() ->
    Script = script("big_header", "#!/bin/sh\nprintf '\\377\\377\\377\\360' >&4\nexec sleep 30\n"),
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             erlang:garbage_collect(),
             erlang:memory(total)
     end,
     fun(_) -> erlcuda_test_util:reset(?DEFAULTS, []) end,
     fun(Before) ->
             {timeout, 30, fun() ->
                 application:load(erlcuda),
                 [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
                 ok = application:set_env(erlcuda, python, Script),
                 ok = application:set_env(erlcuda, start_timeout, 10000),
                 {ok, _} = application:ensure_all_started(erlcuda),
                 %% the header has come once the worker's pid shows and a moment passed
                 ok = erlcuda_test_util:wait_until(
                        fun() -> is_integer(maps:get(worker_os_pid, erlcuda:info())) end, 50),
                 timer:sleep(500),
                 Grown = erlang:memory(total) - Before,
                 ?debugFmt("memory after the header: ~b MB more", [Grown bsr 20]),
                 ?assert(Grown < 512 bsl 20)
             end}
     end}.

script(Name, Text) ->
    Dir = string:trim(os:cmd("mktemp -d")),
    Path = filename:join(Dir, Name),
    ok = file:write_file(Path, Text),
    ok = file:change_mode(Path, 8#755),
    Path.

%% Worker arguments the worker refuses stop the application's start with bad_config (the
%% guide's promise), instead of a worker that restarts for ever.
bad_worker_args_test_() ->
    {setup,
     fun() -> _ = application:stop(erlcuda), application:load(erlcuda) end,
     fun(_) -> erlcuda_test_util:reset(?DEFAULTS, []) end,
     {timeout, 60, fun() ->
         [begin
              [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
              ok = application:set_env(erlcuda, worker_args, Args),
              ?assertMatch({error, {{bad_config, worker_args, _, _}, _}},
                           application:start(erlcuda)),
              ?assertEqual(undefined, whereis(erlcuda_worker))
          end || Args <- [["--bogus-flag"], [<<"--cpu-devices">>, <<"2000">>],
                          ["--max-batch", "0"], ["--spin-us", "x"]]],
         %% arguments it takes start it as before
         ok = application:set_env(erlcuda, worker_args, ["--max-batch", "8"]),
         ok = application:start(erlcuda),
         ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]))
     end}}.

%% The frames this side writes each carry their length, and a batch's launches keep theirs
%% inside it; what the worker sends is cut at each frame's length, however it arrives.
deframe_test() ->
    {ok, Launch} = erlcuda_protocol:encode_launch(1, 0, reduce, [<<1.0:32/float-little>>],
                                                  #{trace => false, result_file => false}),
    L = iolist_to_binary(Launch),
    <<Len:32, Body/binary>> = L,
    ?assertEqual(Len, byte_size(Body)),
    Batch = iolist_to_binary(erlcuda_protocol:encode_batch([Launch, Launch])),
    ?assertEqual(<<(5 + 2 * byte_size(L)):32, $B, 2:32, L/binary, L/binary>>, Batch),
    Call = iolist_to_binary(erlcuda_protocol:encode_call(3, info, [])),
    <<CLen:32, CBody/binary>> = Call,
    ?assertEqual({CLen, {'C', 3, erlcuda, info, []}}, {byte_size(CBody), binary_to_term(CBody)}),
    Frames = [<<$B, 2:32, L/binary, L/binary>>, CBody, <<>>, binary:copy(<<7>>, 100000)],
    Stream = iolist_to_binary([[<<(byte_size(F)):32>>, F] || F <- Frames]),
    %% whole, and cut into pieces of every size from one byte up
    ?assertEqual(Frames, read_all([Stream])),
    [?assertEqual(Frames, read_all(pieces(Stream, Size))) || Size <- [1, 3, 4, 5, 777, 65536]],
    %% a header alone, however large its length, keeps nothing but itself
    R = erlcuda_protocol:reader(),
    {[], R1} = erlcuda_protocol:read(<<16#FFFFFFF0:32>>, R),
    ?assert(erlang:external_size(R1) < 1024).

read_all(Pieces) ->
    {Frames, _} = lists:foldl(fun(P, {Acc, R}) ->
                                      {New, R1} = erlcuda_protocol:read(P, R),
                                      {Acc ++ New, R1}
                              end, {[], erlcuda_protocol:reader()}, Pieces),
    Frames.

pieces(<<>>, _) -> [];
pieces(Bin, Size) when byte_size(Bin) =< Size -> [Bin];
pieces(Bin, Size) ->
    <<P:Size/binary, Rest/binary>> = Bin,
    [P | pieces(Rest, Size)].

%% A worker that writes a log frame and the first bytes of a results frame in one write,
%% the rest a moment later (as any pipe read can cut them): the port owner kept its place
%% in the stream only when the frame before was no log (a log's handler kept the state as
%% it was, dropping what the reader held), and every later job timed out.
frame_after_a_log_frame_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [{python, cut_worker()}, {shm_dir, none},
                                           {start_timeout, 10000}], {timeout, 60, fun() ->
        ?assertEqual([{ok, float(I)} || I <- lists:seq(1, 5)],
                     [erlcuda:launch_sync(reduce, [[float(I)]], [{timeout, 10000}])
                      || I <- lists:seq(1, 5)]),
        ?assertMatch(#{restarts := 0}, erlcuda:info())
    end}).

%% The stand-in worker: control calls answered with a hello, reduce([S]) with S, after a
%% log line, cut 10 bytes into the results frame.
cut_worker() ->
    Log = term_to_binary({'L', info, <<"hello">>}),
    erlcuda_test_util:fake_worker(
      "cut_worker", 1,
      ["LOG = bytes.fromhex('", binary:encode_hex(<<(byte_size(Log)):32, Log/binary>>), "')\n"], [
"def launch(m):\n"
"    body = b'R' + struct.pack('>IQBI', 1, m.job_id, ord('s'), 8)\n"
"    r = struct.pack('>I', len(body) + 8) + body + struct.pack('<d', float(m.args[0][0]))\n"
"    write(LOG + r[:10])\n"
"    time.sleep(0.02)\n"
"    write(r[10:])\n"]).
