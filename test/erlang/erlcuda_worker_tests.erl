%% The port owner (erlcuda_worker) against workers that misbehave: what a frame header
%% makes this side keep, and worker arguments checked before a worker is started.
-module(erlcuda_worker_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {test_hooks, false}, {python, default},
                   {start_timeout, 120000}, {worker_args, []}]).

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
