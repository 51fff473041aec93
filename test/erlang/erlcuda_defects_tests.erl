%% Regression tests for defects a review and a hostile test run found, each named after
%% what it broke; every one failed on the code before its fix.
-module(erlcuda_defects_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

%% launch_sync with {trace, true} always timed out and left the reply in the mailbox.
traced_launch_sync_test_() ->
    with_app([], fun() ->
        ?assertMatch({ok, 3.0, #{<<"recv">> := _, <<"forward">> := _}},
                     erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{trace, true}, {timeout, 5000}])),
        Big = [3.0e38, 3.0e38],
        ?assertMatch({error, {non_finite, _}, #{<<"recv">> := _}},
                     erlcuda:launch_sync(vector_add, [Big, Big], [{trace, true}])),
        no_message()
    end).

%% {timeout, T} above 4294967295 was accepted; launch_sync then raised timeout_value after
%% submitting, and the reply landed in the mailbox later.
timeout_out_of_range_test_() ->
    with_app([], fun() ->
        Big = 4294967296,
        ?assertEqual({error, {bad_option, {timeout, Big}}},
                     erlcuda:launch_sync(reduce, [[1.0]], [{timeout, Big}])),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 4294967295}])),
        timer:sleep(200),
        no_message()
    end).

%% Improper lists as arguments or options raised badarg / function_clause; options given
%% as a map were refused.
improper_lists_and_map_options_test_() ->
    with_app([], fun() ->
        ?assertMatch({error, {bad_args, _}}, erlcuda:launch(vector_add, [[1] | foo])),
        ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(reduce, [[1.0] | [[2.0] | x]])),
        ?assertMatch({error, {bad_option, _}}, erlcuda:launch(reduce, [[1.0]], [{device, 0} | bad])),
        ?assertMatch({error, {bad_option, _}},
                     erlcuda:launch_sync(reduce, [[1.0]], [{format, list} | {device, 0}])),
        ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], #{device => 1})),
        ?assertEqual({ok, <<3.0:32/float-little>>},
                     erlcuda:launch_sync(vector_add, [[1.0], [2.0]],
                                         #{format => binary, timeout => 1000})),
        ?assertEqual({error, {bad_option, {colour, red}}},
                     erlcuda:launch(reduce, [[1.0]], #{colour => red})),
        no_message()
    end).

%% The reason() type lacked {non_finite, _}, so dialyzer in a user's application rejected
%% a handler for a documented error: every reason the worker sends must be in the type.
reason_type_test() ->
    {ok, {erlcuda, [{abstract_code, {raw_abstract_v1, Forms}}]}} =
        beam_lib:chunks(code:which(erlcuda), [abstract_code]),
    [Reason] = [T || {attribute, _, type, {reason, T, []}} <- Forms],
    Tags = type_tags(Reason),
    Missing = [R || R <- erlcuda_contract:reasons(), not lists:member(R, Tags)],
    ?assertEqual([], Missing).

type_tags({type, _, union, Types}) ->
    lists:flatmap(fun type_tags/1, Types);
type_tags({type, _, tuple, [{atom, _, Tag} | _]}) ->
    [Tag];
type_tags({atom, _, Tag}) ->
    [Tag];
type_tags(_) ->
    [].

no_message() -> erlcuda_test_util:no_message().

