%% Job ids and replies (erlcuda_jobs): an id is never issued twice on a node, and a
%% launch_sync caller takes only the reply that came through its own alias.
-module(erlcuda_jobs_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"}, {python_path, []}, {python, default},
                   {start_timeout, 120000}]).

jobs_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [], {timeout, 120, [
        {"ids are not issued again after the application restarts",
         fun ids_outlive_a_restart/0},
        {"old replies left unread do not answer launch_sync after a restart",
         fun old_replies_after_a_restart/0},
        {"a message that names the next job ids is not taken for a reply",
         fun forged_replies/0},
        {"a traced launch_sync takes its own reply too", fun traced/0}]}).

ids_outlive_a_restart() ->
    {ok, Before} = erlcuda:launch(reduce, [[1.0]]),
    receive {erlcuda, Before, {ok, 1.0}} -> ok after 10000 -> error(no_reply) end,
    restart(),
    {ok, After} = erlcuda:launch(reduce, [[1.0]]),
    receive {erlcuda, After, {ok, 1.0}} -> ok after 10000 -> error(no_reply) end,
    ?assert(After > Before).

%% 50 async replies left in the mailbox, then erlcuda restarts: the next 50 launch_sync
%% calls each answer their own job.
old_replies_after_a_restart() ->
    Ids = [begin {ok, Id} = erlcuda:launch(vector_add, [[float(1000 + I)], [1.0]]), Id end
           || I <- lists:seq(1, 50)],
    %% Taken in and put back: the 50 replies wait in this mailbox, unread.
    Old = [receive {erlcuda, Id, {ok, _}} = M -> M after 10000 -> error(no_reply) end
           || Id <- Ids],
    [self() ! M || M <- Old],
    restart(),
    Got = [erlcuda:launch_sync(vector_add, [[float(I)], [1.0]]) || I <- lists:seq(1, 50)],
    ?assertEqual([{ok, [float(I + 1)]} || I <- lists:seq(1, 50)], Got),
    ?assertEqual(50, flush()).

%% Messages shaped like replies, for the ids the next jobs get: launch_sync takes none.
forged_replies() ->
    Next = erlcuda_jobs:next_id(),
    [self() ! {erlcuda, Next + K, {ok, [666.0]}} || K <- lists:seq(1, 20)],
    Got = [erlcuda:launch_sync(vector_add, [[float(I)], [1.0]]) || I <- lists:seq(1, 20)],
    ?assertEqual([{ok, [float(I + 1)]} || I <- lists:seq(1, 20)], Got),
    ?assertEqual(20, flush()).

traced() ->
    Next = erlcuda_jobs:next_id(),
    self() ! {erlcuda, Next + 1, {ok, 666.0}, #{}},
    ?assertMatch({ok, 3.0, #{}}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{trace, true}])),
    ?assertEqual(1, flush()).

restart() ->
    ok = application:stop(erlcuda),
    {ok, _} = application:ensure_all_started(erlcuda).

flush() ->
    flush(0).

flush(N) ->
    receive _ -> flush(N + 1) after 0 -> N end.
