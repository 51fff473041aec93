-module(erlcuda_prof).
-export([main/0]).
main() ->
    application:load(erlcuda),
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    application:set_env(erlcuda, backend, cpu),
    application:set_env(erlcuda, max_queue, 100000),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(500),
    Owner = whereis(erlcuda_worker),
    {links, L} = process_info(Owner, links),
    [Writer] = [P || P <- L, is_pid(P), proc_lib:translate_initial_call(P) =:= {erlcuda_writer, init, 1}],
    A = << <<(float(I rem 97)):32/float-little>> || I <- lists:seq(1, 1000) >>,
    Stop = erlang:monotonic_time(millisecond) + 4000,
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {done, loop([A], Stop, 0)} end) || _ <- lists:seq(1, 1000)],
    timer:sleep(1000),
    Who = case os:getenv("WHO", "owner") of "owner" -> Owner; "writer" -> Writer end,
    eprof:start(),
    eprof:start_profiling([Who]),
    timer:sleep(1500),
    eprof:stop_profiling(),
    Jobs = lists:sum([receive {done, J} -> J end || _ <- Pids]),
    io:format("jobs ~b~n", [Jobs]),
    eprof:analyze(total, [{sort, time}]),
    ok.
loop(Args, Stop, N) ->
    case erlang:monotonic_time(millisecond) >= Stop of
        true -> N;
        false -> {ok, _} = erlcuda:launch_sync(reduce, Args, [{format, binary}, {timeout, 60000}]),
                 loop(Args, Stop, N + 1)
    end.
