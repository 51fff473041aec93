%% The API (erlcuda) is total: every exported function, given bad terms in every argument,
%% returns (`{error, _}' or a value) and never raises or hangs; and its reason() type names
%% every reason the worker sends.
-module(erlcuda_api_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"}, {python_path, []}, {python, default},
                   {start_timeout, 120000}]).

total_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [], {timeout, 300, fun() ->
        Exports = [{F, A} || {F, A} <- erlcuda:module_info(exports), F =/= module_info],
        Raised = lists:append([calls(F, A) || {F, A} <- Exports]),
        ?assertEqual([], lists:sublist(Raised, 10)),
        ?assertEqual(0, erlcuda_jobs:size())
    end}).

%% With `{trace, true}' the buffer helpers answer as launch_sync does, stamps beside the
%% value: the shape their specs now allow (dialyzer checks callers against them).
traced_buffer_helpers_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [], fun() ->
        {ok, B, S1} = erlcuda:upload([1.0, 2.0], [{trace, true}]),
        ?assert(is_map(S1)),
        ?assertMatch({ok, [1.0, 2.0], #{}}, erlcuda:download(B, [{trace, true}])),
        {ok, Z, _} = erlcuda:zeros(f32, 3, [{trace, true}]),
        ?assertEqual({ok, [0.0, 0.0, 0.0]}, erlcuda:download(Z)),
        [ok = erlcuda:free(X) || X <- [B, Z]]
    end).

%% info/0 answers before the application starts, and after it stopped, as not running.
info_before_start_test() ->
    _ = application:stop(erlcuda),
    ?assertMatch(#{status := not_running, backend := undefined, devices := 0,
                   worker_os_pid := undefined}, erlcuda:info()).

%% A buffer given to a process of this node that is no longer alive is refused and stays
%% the caller's (it would be freed at once as the dead owner's).
give_to_a_dead_process_test_() ->
    erlcuda_test_util:with_app(?DEFAULTS, [], fun() ->
        {ok, B} = erlcuda:upload([1.0, 2.0]),
        {Dead, M} = spawn_monitor(fun() -> ok end),
        receive {'DOWN', M, process, Dead, _} -> ok end,
        ?assertMatch({error, {bad_args, _}}, erlcuda:give(B, Dead)),
        Self = self(),
        ?assertMatch(#{owner := Self}, erlcuda:buffer_info(B)),
        ?assertEqual({ok, [1.0, 2.0]}, erlcuda:download(B)),
        ok = erlcuda:free(B)
    end).

bad() ->
    [a, -1, 1.5, <<1, 2, 3>>, [], [a | b], {}, self(), make_ref(), #{a => b}, [[1.0] | x],
     [{device, x}], [{timeout, -1}], [{node, 42}], [{type, nope}],
     {erlcuda_buffer, a, b, c, d, e, f}, {erlcuda_buffer, node(), 0, 0, 1, f32, 1},
     [{keep, true} | x], lists:duplicate(300, 1.0), fun() -> ok end].

calls(F, A) ->
    [{F, Args, Why} || Args <- combos(A, bad()), {raised, Why} <- [call(F, Args)]].

%% Every combination for up to three arguments; past that, the first argument against
%% the same bad term in all the others.
combos(0, _) -> [[]];
combos(1, Bad) -> [[X] || X <- Bad];
combos(N, Bad) when N > 3 -> [[X | lists:duplicate(N - 1, Y)] || X <- Bad, Y <- Bad];
combos(N, Bad) -> [[X | R] || X <- Bad, R <- combos(N - 1, Bad)].

call(F, Args) ->
    Self = self(),
    {P, M} = spawn_monitor(fun() -> Self ! {self(), catch {returned, apply(erlcuda, F, Args)}} end),
    receive
        {P, {returned, _}} -> demonitor(M, [flush]), returned;
        {P, Other} -> demonitor(M, [flush]), {raised, Other};
        {'DOWN', M, process, P, Why} -> {raised, Why}
    after 10000 -> exit(P, kill), {raised, hang}
    end.

%% Every reason the worker sends is in the reason() type, so that dialyzer in a user's
%% application accepts a handler for any documented error (such as {non_finite, _}).
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
